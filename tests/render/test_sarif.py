"""--sarif FILE: a SARIF 2.1.0 document code-scanning services accept, for scan and gate."""
from __future__ import annotations

import json
import os
import pickle

from tests.helpers.malicious import Reduce


def _payload(tmp_path) -> str:
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(Reduce(os.system, "true"), protocol=2))
    return str(path)


def _check_shape(doc: dict) -> dict:
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (run,) = doc["runs"]
    rule_ids = {r["id"] for r in run["tool"]["driver"]["rules"]}
    for result in run["results"]:
        assert result["ruleId"] in rule_ids
        assert result["level"] in ("error", "warning", "note")
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    return run


def test_scan_sarif_names_the_dangerous_call(run_cli, tmp_path):
    evil = _payload(tmp_path)
    out = tmp_path / "scan.sarif"
    r = run_cli("scan", evil, "--sarif", str(out))
    assert r.code == 1
    run = _check_shape(json.loads(out.read_text()))
    errors = [x for x in run["results"] if x["level"] == "error"]
    assert any("system" in x["message"]["text"] and x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
               == evil for x in errors), run["results"]


def test_scan_sarif_of_a_clean_file_has_no_results(run_cli, tmp_path, fixtures_dir):
    out = tmp_path / "scan.sarif"
    r = run_cli("scan", str(fixtures_dir / "tiny_mlp.pth"), "--sarif", str(out))
    assert r.code == 0
    assert _check_shape(json.loads(out.read_text()))["results"] == []


def test_gate_sarif_lists_failed_checks(run_cli, tmp_path, fixtures_dir):
    evil = _payload(tmp_path)
    out = tmp_path / "gate.sarif"
    r = run_cli("gate", evil, str(fixtures_dir / "tiny_mlp.pth"), "--sarif", str(out))
    assert r.code in (1, 2)
    run = _check_shape(json.loads(out.read_text()))
    assert {x["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for x in run["results"]} == {evil}
    assert not list(tmp_path.glob(".*ckpt-tmp*"))
