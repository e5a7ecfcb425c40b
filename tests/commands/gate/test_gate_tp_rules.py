"""ckpt gate --tp-rules FILE (issue 24): a tensor-parallel folder that records no merging rules is gated as the
merged model (every check on the merged tensors, --target included); without the rules it fails ``readable`` with
the one-line refusal (exit 2), as before.

fixtures/deepspeed_parallel/megatron_legacy: Megatron-LM's legacy ``mp_rank_XX`` layout (tp=2) and its
``rules.toml``; fixtures/deepspeed_parallel/tp: a DeepSpeed tp=2 run (its ``expected.safetensors``: the merged
model, embedding rows 17 of 18 padded).
"""
from __future__ import annotations

import json

import pytest
from conftest import ROOT

import ckpt_tool
from tests.helpers import tp_fixtures as tp
from tests.helpers.errors import assert_one_line_error

LEGACY = ROOT / "fixtures" / "deepspeed_parallel" / "megatron_legacy"
RULES = LEGACY / "rules.toml"
TP_RUN, TP_RULES = tp.TP_RUN, tp.TP_RULES

# the module the tp fixture's merged model loads into (fixtures/deepspeed_parallel/generate.py, vocabulary unpadded)
TARGET = """\
from torch import nn


class Merged(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(17, 8)
        self.fc1 = nn.Linear(8, 12)
        self.fc2 = nn.Linear(12, 8)
        self.norm = nn.LayerNorm(8)
"""


def _checks(r) -> dict[str, dict[str, object]]:
    (f,) = json.loads(r.out)["files"]
    return {c["name"]: c for c in f["checks"]}


def test_without_rules_the_folder_fails_readable_with_one_line(run_cli):
    r = run_cli("gate", str(LEGACY), "--json")
    assert_one_line_error(r, "pp=1, tp=2", "--tp-rules")
    assert not _checks(r)["readable"]["passed"]


def test_with_rules_every_check_runs_on_the_merged_model(run_cli):
    r = run_cli("gate", str(LEGACY), "--tp-rules", str(RULES), "--json", "--allow-dtype", "fp32")
    assert r.code == 0, r
    checks = _checks(r)
    assert "readable" not in checks
    assert checks["no-nan-inf"]["passed"] and checks["no-nan-inf"]["detail"] == "16 floating tensors, all finite"
    assert checks["dtype-policy"]["passed"] and not checks["dtype-policy"]["skipped"]


def test_a_bad_rules_file_is_exit_2_before_anything_is_gated(tmp_path, run_cli):
    bad = tmp_path / "rules.toml"
    bad.write_text("replicated = 'a'\n")
    assert_one_line_error(run_cli("gate", str(LEGACY), "--tp-rules", str(bad)), "list of patterns")


def test_a_deepspeed_run_without_rules_is_gated_against_its_target_with_a_rules_file(tmp_path, run_cli):
    """The tp run with universal_checkpoint_info removed (rewritten by torch, weights_only): refused bare; with the
    rules it matches the module it merges into; rules that keep the padded vocabulary row fail matches-target."""
    pytest.importorskip("torch")
    run = tp.run_without_recorded_rules(tmp_path)
    model = tmp_path / "merged.py"
    model.write_text(TARGET)
    target = f"{model}:Merged"
    assert_one_line_error(run_cli("gate", str(run), "--target", target), "universal_checkpoint_info", "--tp-rules")
    rules = tmp_path / "rules.toml"
    rules.write_text(TP_RULES)
    r = run_cli("gate", str(run), "--target", target, "--tp-rules", str(rules), "--json")
    assert r.code == 0, r
    assert _checks(r)["matches-target"]["passed"] and not _checks(r)["matches-target"]["skipped"]
    rules.write_text(TP_RULES.replace("size = 17", "size = 18"))
    r = run_cli("gate", str(run), "--target", target, "--tp-rules", str(rules), "--json")
    assert r.code == 1, r
    failed = _checks(r)["matches-target"]
    assert not failed["passed"] and "embed.weight" in str(failed["detail"])


def test_the_python_api_takes_the_keyword():
    report = ckpt_tool.gate([LEGACY], tp_rules=str(RULES), nan_check=False)
    assert report.passed and report.exit_code == 0
