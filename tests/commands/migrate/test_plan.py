"""migrate's plan: built once from the SourceOptions and MigrateOptions, frozen, typed, picklable; one writer per
output format."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from ckpt_tool import writers
from ckpt_tool.commands.migrate.plan import MigrateOptions, MigratePlan, plan_migration
from ckpt_tool.errors import UsageError
from ckpt_tool.format_names import OutputFormat
from ckpt_tool.formats.options import DEFAULT_SOURCE, SourceOptions


def _plan(src, out=None, source=DEFAULT_SOURCE, **options):
    return plan_migration(src, out, source, MigrateOptions(**options))


def test_every_output_format_has_one_writer():
    formats = [w.format for w in writers.WRITERS]
    assert sorted(formats) == sorted(OutputFormat)  # each once
    assert {w.format for w in writers.WRITERS if w.folder} == writers.FOLDER_FORMATS
    # every --to value and extension names one format
    names = [n for w in writers.WRITERS for n in w.names]
    assert len(names) == len(set(names)) and set(writers.TO_CHOICES) == set(names)
    extensions = [e for w in writers.WRITERS for e in w.extensions]
    assert len(extensions) == len(set(extensions))


@pytest.mark.parametrize("out,to,shards,fmt", [
    ("a.pth", None, None, OutputFormat.TORCH_ZIP),
    ("a.bin", None, None, OutputFormat.TORCH_ZIP),
    ("a.safetensors", None, None, OutputFormat.SAFETENSORS),
    ("shards/", None, 1000, OutputFormat.SHARDED),
    ("folder", "dcp", None, OutputFormat.DCP),
    (None, None, None, OutputFormat.TORCH_ZIP),
])
def test_choose_format_names_an_output_format_that_is_still_its_string(out, to, shards, fmt):
    got = writers.choose_format(out, to, shards)
    assert got is fmt and got == fmt.value and f"{got}" == fmt.value


def test_the_plan_is_frozen_typed_and_crosses_a_process_boundary(tmp_path):
    plan = _plan(tmp_path / "src.pth", tmp_path / "out.safetensors", SourceOptions(key="model", unsafe=True),
                 strip_prefix=["module."], dtype="bf16", target_kwargs={"n": 2}, allow_missing=["head.*"],
                 devices=["cpu"], max_shard_size=None, workers=3, verify=False)
    assert isinstance(plan, MigratePlan)
    assert plan.source.path == str(tmp_path / "src.pth") and plan.source.key == "model" and plan.source.unsafe
    assert plan.output.state_dict_only  # --key writes the selected state_dict alone
    assert plan.output.format is OutputFormat.SAFETENSORS and not plan.output.folder
    assert plan.rules.strip_prefix == ("module.",) and plan.rules.dtype == "bf16"
    v = plan.verification
    assert (v.enabled, v.devices, v.allow_missing, dict(v.target_kwargs or {})) == (False, ("cpu",), ("head.*",),
                                                                                    {"n": 2})
    assert plan.parallelism.workers == 3 and plan.parallelism.dist is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.output.force = True  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_a_sharded_plan_is_a_folder(tmp_path):
    plan = _plan("src.pth", tmp_path / "shards", max_shard_size="1MB")
    assert plan.output.format is OutputFormat.SHARDED and plan.output.folder and plan.output.shard_bytes == 10**6


@pytest.mark.parametrize("kwargs,message", [
    ({"out": None}, "-o OUT"),
    ({"auto": True}, "--target SPEC"),
    ({"out": "a.safetensors", "sanitize": True}, "--sanitize"),
    ({"out": "a.onnx"}, "cannot tell the output format"),
])
def test_usage_errors_are_raised_by_the_planner_before_anything_is_read(kwargs, message):
    kwargs = {"out": "a.pth", **kwargs}
    with pytest.raises(UsageError, match=message):
        _plan("does-not-exist.pth", **kwargs)


def test_rules_given_whole_replace_the_rule_options():
    from ckpt_tool.keys.rules import RuleSet

    rules = RuleSet(add_prefix="x.")
    assert _plan("s.pth", "o.pth", rules=rules, strip_prefix=["ignored."]).rules is rules


def test_a_dry_run_plans_no_ranks(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _plan("s.pth", dry_run=True).parallelism.dist is None
    dist = _plan("s.pth", "o.safetensors").parallelism.dist
    assert dist is not None and (dist.rank, dist.world, dist.leader) == (1, 2, False)
    assert pickle.loads(pickle.dumps(dist)) == dist

