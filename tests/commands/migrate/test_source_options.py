"""The rules line says how the source was read: --tp-rules FILE and --unstack-layers are rules too."""
from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "deepspeed_parallel"
LEGACY = FIXTURES / "megatron_legacy"


def test_tp_rules_alone_are_named_on_the_rules_line(run_cli, tmp_path: Path) -> None:
    rules = str(LEGACY / "rules.toml")
    r = run_cli("migrate", str(LEGACY), "-o", str(tmp_path / "m.safetensors"), "--tp-rules", rules)
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("rules:"))
    assert f"--tp-rules {rules}" in line and "(no key rules)" in line


def test_tp_rules_beside_key_rules_and_in_json(run_cli, tmp_path: Path) -> None:
    rules = str(LEGACY / "rules.toml")
    r = run_cli("migrate", str(LEGACY), "-o", str(tmp_path / "m.safetensors"), "--tp-rules", rules,
                "--add-prefix", "model.", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["source_options"] == [f"--tp-rules {rules}"]
    text = run_cli("migrate", str(LEGACY), "-o", str(tmp_path / "n.safetensors"), "--tp-rules", rules,
                   "--add-prefix", "model.").out
    line = next(x for x in text.splitlines() if x.startswith("rules:"))
    assert line.split(None, 1)[1] == f"--add-prefix model. --tp-rules {rules}"


def test_a_plain_source_says_no_rules(run_cli, tmp_path: Path) -> None:
    src = Path(__file__).resolve().parents[3] / "fixtures" / "tiny_mlp.pth"
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "m.safetensors"))
    assert r.code == 0, r.err
    assert "rules:    (no rules)" in r.out
