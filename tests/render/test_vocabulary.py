"""The closed vocabularies are str Enums: the text, JSON and SARIF show the plain names, never the Enum's repr."""
from __future__ import annotations

import json
import os
import pickle

from ckpt_tool.commands.gate.names import CheckName
from ckpt_tool.format_names import Format
from ckpt_tool.pickles import severity
from ckpt_tool.pickles.scanner import Found
from ckpt_tool.render.common import dumps
from tests.helpers.malicious import Reduce


def test_enums_serialise_as_their_names():
    doc = {Format.TORCH_ZIP: [severity.DANGEROUS, Found.DCP_DATA]}
    assert json.loads(dumps(doc)) == {"torch-zip": ["dangerous", "dcp-data"]}
    assert f"{Format.SAFETENSORS} {severity.SAFE:<11}|" == "safetensors safe       |"
    assert severity.worst(["safe", "dangerous", "suspicious"]) is severity.Severity.DANGEROUS
    assert severity.worst([]) is severity.SAFE


def test_scan_text_json_and_sarif_show_plain_names(run_cli, tmp_path, fixtures_dir):
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(Reduce(os.system, "true"), protocol=2))
    paths = [str(evil), str(fixtures_dir / "tiny_mlp.pth")]
    text = run_cli("scan", *paths).out
    assert "DANGEROUS" in text and "(pickle, 1 pickle)" in text and "(torch-zip," in text
    assert "Severity" not in text and "Format" not in text
    doc = json.loads(run_cli("scan", "--json", *paths).out)
    assert [f["format"] for f in doc["files"]] == ["pickle", "torch-zip"]
    assert doc["counts"] == {"safe": 1, "suspicious": 0, "dangerous": 1, "error": 0}
    run_cli("gate", paths[1], "--sarif", str(tmp_path / "g.sarif"))
    rules = json.loads((tmp_path / "g.sarif").read_text())["runs"][0]["tool"]["driver"]["rules"]
    described = "The gate check 'loads-safely': " + CheckName.LOADS_SAFELY.describe
    assert rules[0] == {"id": "gate/loads-safely", "shortDescription": {"text": described}}
    assert all("CheckName" not in json.dumps(r) for r in rules)
