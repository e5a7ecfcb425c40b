"""The typed facts ``ckpt inspect`` states about a checkpoint's run (commands/inspect/facts.py), read once from what
the readers recorded, on the committed fixtures; the summary line is made from them alone."""
from __future__ import annotations

from dataclasses import replace

from conftest import ROOT

from ckpt_tool import inspect
from ckpt_tool.commands.inspect import (
    DeepSpeedRun,
    DistributedSafetensors,
    MegatronCore,
    MegatronLegacy,
    ShardedSet,
    SourceFacts,
)
from ckpt_tool.render.inspect import summary_lines

F = ROOT / "fixtures"
LEGACY = F / "deepspeed_parallel" / "megatron_legacy"


def training_line(report) -> str:
    return next(line for line in summary_lines(report) if line.startswith("training:"))


def test_a_plain_file_states_no_run():
    report = inspect(F / "tiny_mlp.pth")
    assert report.facts == SourceFacts()
    assert not any(line.startswith("training:") for line in summary_lines(report))


def test_zero3_run():
    report = inspect(F / "deepspeed" / "zero3_bf16")
    ds = report.facts.deepspeed
    assert isinstance(ds, DeepSpeedRun)
    assert (ds.zero_stage, ds.world_size, ds.dtype, ds.tag, ds.universal, ds.parallel, ds.experts) == (
        3, 2, "bfloat16", "global_step1", False, None, ())
    assert training_line(report).startswith("training:   DeepSpeed ZeRO-3, 2 rank(s), bfloat16, tag global_step1")


def test_moe_run_counts_experts_per_layer():
    ds = inspect(F / "deepspeed_moe" / "zero2_ep2").facts.deepspeed
    assert ds is not None and ds.experts == (4, 4) and ds.expert_files == 8


def test_universal_checkpoint_says_what_it_was_merged_from():
    report = inspect(F / "deepspeed_parallel" / "universal")
    ds = report.facts.deepspeed
    assert ds is not None and ds.universal and ds.parallel == (1, 2)
    assert ", merged from pp=1 tp=2, " in training_line(report)


def test_megatron_legacy_merged_by_its_rules_file():
    report = inspect(LEGACY, tp_rules=str(LEGACY / "rules.toml"))
    meg = report.facts.megatron_legacy
    assert isinstance(meg, MegatronLegacy)
    assert (meg.pp, meg.tp, meg.merged, meg.merged_by) == (1, 2, True, str(LEGACY / "rules.toml"))
    assert report.facts.megatron_core is None
    assert training_line(report).endswith(f"pp=1 tp=2, merged by {LEGACY / 'rules.toml'}")


def test_megatron_core_stacked_and_unstacked():
    stacked = inspect(F / "megatron" / "dense").facts.megatron_core
    unstacked = inspect(F / "megatron" / "dense", unstack_layers=True).facts.megatron_core
    assert isinstance(stacked, MegatronCore) and isinstance(unstacked, MegatronCore)
    assert (stacked.backend, stacked.unstacked, stacked.stacked_layers) == ("torch_dist", False, 2)
    assert unstacked.unstacked and stacked.common_keys == ("args", "checkpoint_version", "iteration")
    assert stacked.saved_with == (("tp", 1), ("pp", 1), ("ep", 1))


def test_distributed_safetensors_and_sharded_sets():
    dist = inspect(F / "dist_safetensors" / "run").facts.distributed
    assert dist == DistributedSafetensors(ranks=2, files=2, slices=11)
    assert inspect(F / "sharded").facts.sharded == ShardedSet(shard_format="safetensors", shards=2)


def test_the_summary_reads_the_facts_not_the_metadata():
    """Changing the typed fact changes the line, with the metadata dict untouched: the renderer reads the fact."""
    report = inspect(F / "deepspeed" / "zero1_fp32")
    ds = report.facts.deepspeed
    assert ds is not None
    edited = replace(report, facts=replace(report.facts, deepspeed=replace(ds, world_size=64)))
    assert ", 64 rank(s)" in training_line(edited) and ", 2 rank(s)" in training_line(report)
