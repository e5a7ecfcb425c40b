"""What the readers found about the run behind a checkpoint, as typed facts ``ckpt inspect`` shows.

The readers record it in the checkpoint's metadata, JSON-safe, where
``--json`` shows it as it is (formats/deepspeed/meta.py, universal.py and
parallel.py; formats/deepspeed/megatron.py; formats/dcp/megatron.py;
formats/safetensors/distributed.py; a sharded set's index). ``source_facts``
reads those entries once, here, so that the renderer reads fields, never a
dict by string key. A value of an unexpected type is kept as its text: it
prints as it always did.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized
from dataclasses import dataclass

from ...format_names import Format
from ...model import Checkpoint

Scalar = str | int | float | bool | None  # a figure as the reader wrote it


def _scalar(value: object) -> Scalar:
    """``value`` itself when it is a JSON scalar, else its text (what an f-string prints of it either way)."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


@dataclass(frozen=True, kw_only=True)
class ShardedSet:
    """A ``*.index.json`` weight map: the shards' format and how many there are."""

    shard_format: Scalar
    shards: int


@dataclass(frozen=True, kw_only=True)
class DeepSpeedRun:
    """The DeepSpeed run a consolidated model comes from."""

    universal: bool  # a universal checkpoint (ds_to_universal), merged from its parallel layout
    zero_stage: Scalar
    layout: Scalar  # zero, pipeline, tensor-parallel, universal
    parallel: tuple[Scalar, Scalar] | None  # (pp, tp) when the run recorded them
    world_size: Scalar
    dtype: Scalar
    tag: Scalar
    version: Scalar  # DeepSpeed's, "?" when not recorded
    experts: tuple[Scalar, ...] = ()  # experts per MoE layer (none: not a MoE run)
    expert_files: Scalar = None


@dataclass(frozen=True, kw_only=True)
class MegatronLegacy:
    """Megatron-LM's ``mp_rank_XX`` folders: the iteration and parallel sizes, and the rules file that merged them."""

    iteration: Scalar
    pp: Scalar
    tp: Scalar
    merged_by: Scalar = None  # the --tp-rules file's origin, when tensor-parallel shards were merged with it
    merged: bool = False


@dataclass(frozen=True, kw_only=True)
class MegatronCore:
    """A Megatron-core torch_dist folder: what metadata.json and common.pt say."""

    backend: Scalar
    backend_version: Scalar
    unstacked: bool  # read with --unstack-layers
    stacked_layers: Scalar
    common_keys: tuple[str, ...] | None  # common.pt's top-level entries, sorted (None: no common.pt)
    saved_with: tuple[tuple[str, Scalar], ...] | None  # the parallel sizes common.pt records


@dataclass(frozen=True, kw_only=True)
class DistributedSafetensors:
    """A HuggingFaceStorageWriter(save_distributed=True) folder: its rank files and slices."""

    ranks: Scalar
    files: Scalar
    slices: Scalar


@dataclass(frozen=True, kw_only=True)
class SourceFacts:
    """Each fact ``ckpt inspect`` states about where a checkpoint comes from; None where it does not apply."""

    sharded: ShardedSet | None = None
    deepspeed: DeepSpeedRun | None = None
    megatron_legacy: MegatronLegacy | None = None
    megatron_core: MegatronCore | None = None
    distributed: DistributedSafetensors | None = None


NO_FACTS = SourceFacts()


def source_facts(ckpt: Checkpoint) -> SourceFacts:
    """The facts the readers recorded in ``ckpt``'s metadata, read once."""
    meta = ckpt.metadata
    megatron = meta.get("megatron") if ckpt.framework == "megatron" else None
    legacy = ckpt.format == Format.MEGATRON_LEGACY
    dist = meta.get("distributed_safetensors") if ckpt.format == Format.DIST_SAFETENSORS else None
    return SourceFacts(
        sharded=_sharded(meta) if ckpt.format == Format.SHARDED else None,
        deepspeed=_deepspeed(meta.get("deepspeed")) if ckpt.format == Format.DEEPSPEED else None,
        megatron_legacy=_megatron_legacy(megatron) if legacy and isinstance(megatron, dict) else None,
        megatron_core=_megatron_core(megatron) if not legacy and isinstance(megatron, dict) else None,
        distributed=DistributedSafetensors(ranks=_scalar(dist.get("ranks")), files=_scalar(dist.get("files")),
                                           slices=_scalar(dist.get("slices")))
        if isinstance(dist, dict) else None,
    )


def _sharded(meta: Mapping[str, object]) -> ShardedSet:
    shards = meta.get("shards", [])
    return ShardedSet(shard_format=_scalar(meta.get("shard_format")),
                      shards=len(shards) if isinstance(shards, Sized) else 0)


def _deepspeed(ds: object) -> DeepSpeedRun | None:
    if not isinstance(ds, dict):
        return None
    moe = ds.get("moe")
    counts = moe.get("num_experts") if isinstance(moe, dict) else None
    return DeepSpeedRun(
        universal=ds.get("layout") == "universal", zero_stage=_scalar(ds.get("zero_stage")),
        layout=_scalar(ds.get("layout")),
        parallel=(_scalar(ds.get("pp")), _scalar(ds.get("tp"))) if "pp" in ds else None,
        world_size=_scalar(ds.get("world_size")), dtype=_scalar(ds.get("dtype")), tag=_scalar(ds.get("tag")),
        version=_scalar(ds.get("ds_version", "?")),
        experts=tuple(map(_scalar, counts)) if isinstance(counts, Sequence) and not isinstance(counts, str) else (),
        expert_files=_scalar(moe.get("expert_files")) if isinstance(moe, dict) else None,
    )


def _megatron_legacy(meg: Mapping[str, object]) -> MegatronLegacy:
    rules = meg.get("tp_rules")
    merged = isinstance(rules, dict) and meg.get("tp", 1) != 1
    return MegatronLegacy(iteration=_scalar(meg.get("iteration")), pp=_scalar(meg.get("pp")),
                          tp=_scalar(meg.get("tp")), merged=merged,
                          merged_by=_scalar(rules.get("from")) if isinstance(rules, dict) else None)


def _megatron_core(meg: Mapping[str, object]) -> MegatronCore:
    backend = meg.get("metadata.json") or {}
    get = backend.get if isinstance(backend, Mapping) else {}.get
    common = meg.get("common.pt")
    parallel = meg.get("parallel")
    return MegatronCore(
        backend=_scalar(get("sharded_backend", "?")), backend_version=_scalar(get("sharded_backend_version", "?")),
        unstacked=bool(meg.get("unstacked")), stacked_layers=_scalar(meg.get("stacked_layers") or 0),
        common_keys=tuple(str(k) for k in sorted(common)) if isinstance(common, dict) else None,
        saved_with=tuple((str(k), _scalar(v)) for k, v in parallel.items()) if isinstance(parallel, dict) else None,
    )
