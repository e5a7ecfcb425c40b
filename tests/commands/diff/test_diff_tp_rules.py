"""ckpt diff --tp-rules FILE (issue 24): a tensor-parallel run that records no merging rules is compared as its
merged model, with the rules file ``ckpt migrate --tp-rules`` takes; without it, the one-line refusal (exit 2).

fixtures/deepspeed_parallel/megatron_legacy is Megatron-LM's legacy ``mp_rank_XX`` layout (tp=2) with the
``rules.toml`` that merges it; ``expected.safetensors`` beside it is the merged model
(fixtures/deepspeed_parallel/generate.py).
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
EXPECTED = LEGACY / "expected.safetensors"


def test_without_rules_the_megatron_folder_stays_refused(run_cli):
    assert_one_line_error(run_cli("diff", str(LEGACY), str(EXPECTED)), "pp=1, tp=2", "--tp-rules")


def test_with_rules_it_equals_its_merged_model_in_keys_shapes_and_dtypes(run_cli):
    r = run_cli("diff", str(LEGACY), str(EXPECTED), "--tp-rules", str(RULES), "--json")
    assert r.code == 0, r
    got = json.loads(r.out)
    assert got["equal"] and (got["a_format"], got["a_tensors"], got["b_tensors"]) == ("megatron-legacy", 16, 16)
    assert not (got["missing"] or got["unexpected"] or got["shape_mismatch"] or got["dtype_mismatch"])


def test_the_rules_decide_what_is_compared(tmp_path, run_cli):
    """The same rules with Megatron's padded vocabulary kept: the embedding has 16 rows, not 15, and diff says so."""
    padded = tmp_path / "rules.toml"
    padded.write_text(RULES.read_text().replace("size = 15", "size = 16"))
    r = run_cli("diff", str(LEGACY), str(EXPECTED), "--tp-rules", str(padded), "--json")
    assert r.code == 1, r
    (mm,) = json.loads(r.out)["shape_mismatch"]
    assert mm["key"] == "language_model.embedding.word_embeddings.weight"
    assert (mm["a"], mm["b"]) == ([16, 8], [15, 8])


def test_either_side_may_be_the_tensor_parallel_folder(run_cli):
    r = run_cli("diff", str(EXPECTED), str(LEGACY), "--tp-rules", str(RULES), "-q")
    assert r.code == 0, r


def test_a_bad_rules_file_is_exit_2(tmp_path, run_cli):
    bad = tmp_path / "rules.toml"
    bad.write_text("[[tp]]\npattern = 'x'\n")
    assert_one_line_error(run_cli("diff", str(LEGACY), str(EXPECTED), "--tp-rules", str(bad)), "needs 'dim'")
    assert_one_line_error(run_cli("diff", str(LEGACY), str(EXPECTED), "--tp-rules", str(tmp_path / "none.toml")),
                          "cannot read the tensor-parallel rules file")


# -- values: read through the merge, bit for bit ----------------------------------------------------------------
torch = pytest.importorskip("torch")

TP_RUN, TP_RULES = tp.TP_RUN, tp.TP_RULES


def test_values_of_the_merged_megatron_folder_equal_its_merged_model(run_cli):
    r = run_cli("diff", str(LEGACY), str(EXPECTED), "--tp-rules", str(RULES), "--values", "--json")
    assert r.code == 0, r
    got = json.loads(r.out)
    assert got["values_compared"] and got["values_total"] == 16 and not got["value_mismatch"]


def test_a_deepspeed_tp_run_without_universal_info_diffs_with_a_rules_file(tmp_path, run_cli):
    """The tp fixture with universal_checkpoint_info removed (rewritten by torch, weights_only), as an AutoTP
    run records none: refused bare, equal to the live ranks' merged parameters with the rules."""
    run = tp.run_without_recorded_rules(tmp_path)
    expected = TP_RUN / "expected.safetensors"
    assert_one_line_error(run_cli("diff", str(run), str(expected)), "universal_checkpoint_info", "--tp-rules")
    rules = tmp_path / "rules.toml"
    rules.write_text(TP_RULES)
    r = run_cli("diff", str(run), str(expected), "--tp-rules", str(rules), "--values")
    assert r.code == 0, r
    assert "7 compared, 0 outside tolerance" in r.out
    report = ckpt_tool.diff(run, expected, tp_rules=str(rules), values=True)  # the Python API, same keyword
    assert report.equal and report.compared_values


def test_the_python_api_takes_tp_rules():
    assert ckpt_tool.diff(LEGACY, EXPECTED, tp_rules=str(RULES)).equal
