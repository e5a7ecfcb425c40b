"""diff as a plan and steps (commands/diff/plan.py, read.py, steps.py): the options checked once, the plan run
without the keyword function, and the report's typed parts behind the flat names and the JSON of CONTRACT."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT
from models import TinyMLP

from ckpt_tool import diff
from ckpt_tool.commands.diff import (
    DiffHooks,
    DiffOptions,
    DiffReport,
    KeyDiff,
    MetadataDiff,
    RulesApplied,
    ValueView,
    diff_plan,
    run_diff,
)
from ckpt_tool.errors import InputError, UsageError
from ckpt_tool.format_names import DiffMetric
from ckpt_tool.formats import SourceOptions
from ckpt_tool.keys.rules import RuleSet

F = ROOT / "fixtures"
BASE, DP = F / "tiny_mlp.pth", F / "tiny_mlp_dp.pth"
MODELS = str(F / "models.py")

# CONTRACT's keys of `ckpt diff --json`, in the order they have always been written
JSON_KEYS = ["equal", "a", "b", "b_kind", "a_format", "b_format", "a_tensors", "b_tensors", "missing", "unexpected",
             "shape_mismatch", "dtype_mismatch", "value_mismatch", "values_compared", "values", "values_total",
             "sort", "top", "rollups", "rules_applied", "atol", "rtol", "metadata_diff", "suggestion",
             "plain_tensor_attributes", "tied", "warnings", "weights_only"]


@pytest.mark.parametrize(("b", "options", "message"), [
    (None, DiffOptions(), "give either a second checkpoint B or --target SPEC"),
    (BASE, DiffOptions(target=f"{MODELS}:TinyMLP"), "give either a second checkpoint B or --target SPEC"),
    (None, DiffOptions(target=f"{MODELS}:TinyMLP", values=True), "--values compares two checkpoints"),
    (None, DiffOptions(target=f"{MODELS}:TinyMLP", key_b="model"), "--key-b selects inside a second checkpoint"),
    (BASE, DiffOptions(view=ValueView(top=3)), "add --values"),
    (BASE, DiffOptions(values=True, atol=-1.0), "--atol and --rtol must be non-negative"),
    (BASE, DiffOptions(values=True, rtol=float("nan")), "--atol and --rtol must be non-negative"),
])
def test_the_plan_refuses_options_that_contradict_each_other(b, options, message):
    with pytest.raises(UsageError, match=message):
        diff_plan(BASE, b, SourceOptions(), options)


def test_the_first_contradiction_is_the_one_said():
    """B and a target and --values: the CLI has always said "exactly one" first."""
    with pytest.raises(UsageError, match="exactly one"):
        diff_plan(BASE, BASE, SourceOptions(), DiffOptions(target=f"{MODELS}:TinyMLP", values=True))


def test_key_b_reads_b_with_another_key_and_the_same_source_options():
    source = SourceOptions(key="model", unsafe=False)
    plan = diff_plan(BASE, BASE, source, DiffOptions(key_b="weights"))
    assert plan.source_b == SourceOptions(key="weights")
    assert diff_plan(BASE, BASE, source).source_b is source


def test_run_diff_gives_what_the_keyword_function_gives():
    rules = RuleSet(strip_prefix=("module.",))
    view = ValueView(sort=DiffMetric.MAX_ABS, top=2, rollup_depth=1)
    by_keywords = diff(DP, BASE, values=True, rules=rules, auto=True, view=view, atol=0.0)
    options = DiffOptions(values=True, rules=rules, auto=True, view=view, atol=0.0)
    by_plan = run_diff(diff_plan(DP, BASE, SourceOptions(), options), DiffHooks())
    assert json.dumps(by_plan.to_json()) == json.dumps(by_keywords.to_json())
    assert by_plan.figures.compared == 7 and len(by_plan.figures.values) == 2 and by_plan.rewrite.renamed == 7


def test_the_json_keeps_contract_keys_in_their_order():
    doc = diff(DP, BASE).to_json()
    assert list(doc) == JSON_KEYS
    assert list(doc["metadata_diff"]) == ["changed", "only_a", "only_b"]


def test_the_parts_hold_what_the_flat_names_read(tmp_path):
    sd = TinyMLP().state_dict()
    torch.save({"model": sd, "epoch": 4}, tmp_path / "b.pth")
    sd["extra"] = torch.zeros(2)
    sd["encoder.weight"] = torch.zeros(3, 3, dtype=torch.float16)
    del sd["head.bias"]
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "a.pth")
    report = diff(tmp_path / "a.pth", tmp_path / "b.pth", key="state_dict", key_b="model")
    assert isinstance(report, DiffReport)
    keys = report.keys
    assert isinstance(keys, KeyDiff)
    assert keys.missing == report.missing == ("head.bias",)
    assert keys.unexpected == report.unexpected == ("extra",)
    assert [m.key for m in keys.shape_mismatch] == [m.key for m in report.shape_mismatch] == ["encoder.weight"]
    assert [(m.a, m.b) for m in keys.dtype_mismatch] == [("float16", "float32")]
    assert isinstance(report.metadata, MetadataDiff) and report.metadata.differs
    assert report.metadata_diff == report.metadata.to_json() == report.to_json()["metadata_diff"]
    assert [(c.path, c.a, c.b) for c in report.metadata.changed] == [("epoch", 3, 4)]
    assert report.rewrite == RulesApplied() and report.rule_steps == () and report.rules is None
    assert (report.sides.key, report.sides.key_b, report.key, report.key_b) == ("state_dict", "model") * 2
    assert not report.equal


def test_a_b_that_cannot_be_read_is_one_error_after_a_was_read(tmp_path):
    (tmp_path / "b.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError):
        run_diff(diff_plan(BASE, tmp_path / "b.pth"))
