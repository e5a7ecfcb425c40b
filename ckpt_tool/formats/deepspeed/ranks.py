"""One model-parallel rank of a DeepSpeed checkpoint: its ZeRO 0-3 partitions put back together.

The keys, shapes and dtypes come from rank 0's model states
(``param_shapes``, ``frozen_param_shapes``, ``buffer_names``,
``shared_params``); the optimizer-states pickles are read with the
restricted unpickler, so their storages (the fp32 masters and the Adam
moments) stay on disk. Each consolidated tensor is a list of byte ranges of
those files (deepspeed_merge.py) read by a SegmentSource only when data is
needed: trainable parameters are the fp32 master weights, frozen parameters
and buffers come from the model states in the dtype they were saved in, tied
parameters share one storage. Where DeepSpeed's own zero_to_fp32 would drop
something (frozen parameters of ZeRO-1 runs) ckpt keeps it and says so.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

from ...errors import InputError
from ...io import Part, Segment, SegmentSource, paths
from ...model import DataSource, GlobalRef, StorageRef, TensorMeta, contiguous_strides
from ...pickles.unpickle import LazyTensor, Placeholder
from ..checkpoint import file_danger
from ..interface import ReadOptions
from .files import RunFiles, check_ranks
from .merge import MergeError, zero2_group, zero3_frozen, zero3_params
from .moe import expert_tensors, is_moe, judge_strays

_FP32 = 4


class StatesReader:
    """One pass over a run's pickles, gathering references, warnings and byte sources."""

    def __init__(self, run: RunFiles, options: ReadOptions) -> None:
        self.run = run
        self.options = options
        self.references: list[GlobalRef] = []
        self.warnings: list[str] = []
        self.sources: list[DataSource] = []

    def value(self, path: str) -> object:
        """What a torch.save file holds (read statically), its findings kept."""
        from ..torchsave import read_torch_zip

        loaded = read_torch_zip(path, self.options)
        self.references += loaded.references
        self.sources += loaded.sources
        name = paths.basename(path)
        self.warnings += file_danger(name, loaded.references, "torch.load(weights_only=False)")
        self.warnings += [f"{name}: {w}" for w in loaded.warnings]
        return loaded.root

    def pickle(self, path: str) -> dict[Any, Any]:
        root = self.value(path)
        if not isinstance(root, Mapping):
            raise InputError("not a DeepSpeed states file (its pickle holds no dict)", path)
        return dict(root)


@dataclass
class RankPart:
    """One model-parallel rank's data-parallel consolidation (the whole model when there is one rank)."""

    reader: StatesReader
    builder: TensorBuilder
    m0: dict[Any, Any]
    optim: list[dict[Any, Any]]
    stage: int
    world: int
    tensors: OrderedDict[str, TensorMeta]


def consolidate(run: RunFiles, options: ReadOptions, m0: dict[Any, Any] | None = None,
                module: Mapping[str, Any] | None = None) -> RankPart:
    """The ZeRO partitions of one model-parallel rank put back together.

    ``m0`` is its model states when already read; ``module`` replaces their
    ``module`` entry (a pipeline stage's, gathered from its layer files).
    """
    reader = StatesReader(run, options)
    model_path = run.model[0][1]
    if m0 is None:
        m0 = reader.pickle(model_path)
    if module is not None:
        m0 = dict(m0, module=module)
    for key in ("module", "buffer_names", "param_shapes"):
        if key not in m0:
            raise InputError(f"not a DeepSpeed model-states file: no {key!r} entry", model_path)
    moe = is_moe(m0)
    experts = expert_tensors(run, m0, reader) if moe else {}
    if not moe:
        judge_strays(run, reader)
    for _, path in run.expert_optim:  # judged as the loader opens them (a MoE run's optimizer, no weights)
        reader.value(path)
    source = SegmentSource(run.folder, reader.sources)
    builder = TensorBuilder(source, model_path)
    if moe:
        optim = [_optimizer_dict(reader.pickle(p), p) for _, p in run.optim]
        stage, world = _stage_and_world(optim[0], run.optim[0][1]) if optim else (0, int(m0.get("dp_world_size") or 1))
        if stage == 3:
            raise InputError("a ZeRO-3 MoE run: DeepSpeed 0.19.8 runs native MoE under ZeRO stage 1/2 only, and "
                             "ckpt does not assemble experts partitioned in ZeRO-3 optimizer states", run.folder)
        _stage0(m0, builder, reader, what="a MoE run: the weights are the module's and its expert files' (what "
                "DeepSpeed's load_checkpoint restores)")
        for key, value in experts.items():
            builder.saved(key, value, "expert parameter")
    elif not run.optim:
        stage, world, optim = 0, int(m0.get("dp_world_size") or 1), []
        _stage0(m0, builder, reader)
    else:
        check_ranks(run.optim, "optimizer-states", run.folder)
        optim = [_optimizer_dict(reader.pickle(p), p) for _, p in run.optim]
        stage, world = _stage_and_world(optim[0], run.optim[0][1])
        if world != len(optim):
            raise InputError(f"the optimizer states say {world} ranks but {len(optim)} *_optim_states.pt files "
                             "are here (an old checkpoint overwritten, or a rank that did not save)", run.folder)
        try:
            if stage == 3:
                check_ranks(run.model, "model-states", run.folder)
                if len(run.model) != world:
                    raise InputError(f"{len(run.model)} model-states files for {world} ranks", run.folder)
                models = [m0] + [reader.pickle(p) for _, p in run.model[1:]]
                _zero3(models, optim, builder, reader)
            else:
                _zero12(m0, optim, world, builder, reader)
        except MergeError as exc:
            raise InputError(f"the ZeRO-{stage} partitions do not match the parameter shapes: {exc}",
                             run.folder) from None
    return RankPart(reader, builder, m0, optim, stage, world, builder.ordered(m0["module"]))


class TensorBuilder:
    """The consolidated tensors, each a list of segments (or a view of a model-states storage)."""

    def __init__(self, source: SegmentSource, path: str) -> None:
        self.source = source
        self.path = path
        self.tensors: dict[str, TensorMeta] = {}

    def segments(self, key: str, dtype: str, shape: tuple[int, ...], segs: list[Segment], itemsize: int) -> None:
        nbytes = self.source.add(key, segs)
        if nbytes != prod(shape) * itemsize:
            raise InputError(f"tensor {key!r} would hold {nbytes} bytes, not the {prod(shape) * itemsize} "
                             f"its shape {list(shape)} needs", self.path)
        self.tensors[key] = TensorMeta(key, dtype, shape, contiguous_strides(shape), 0,
                                       StorageRef(self.source, key, nbytes))

    def saved(self, key: str, t: Any, what: str) -> None:
        """A tensor kept whole in a model-states file (a buffer, a ZeRO-1/2 frozen parameter)."""
        if not isinstance(t, LazyTensor) or t.storage is None:
            raise InputError(f"the {what} {key!r} is not a tensor with data", self.path)
        itemsize = t.dtype.itemsize
        meta = TensorMeta(key, t.dtype.name, t.shape, t.stride, t.storage_offset, t.storage)
        start, end = meta.byte_span
        if end > t.storage.nbytes:
            raise InputError(f"the {what} {key!r} reaches past the end of its storage", self.path)
        if meta.is_contiguous:
            segs = [Segment(t.storage.source, t.storage.key, start, end - start)] if end > start else []
            self.segments(key, t.dtype.name, t.shape, segs, itemsize)
        else:
            self.tensors[key] = meta

    def tie(self, key: str, source_key: str) -> None:
        src = self.tensors[source_key]
        self.tensors[key] = TensorMeta(key, src.dtype, src.shape, src.stride, src.storage_offset, src.storage)

    def ordered(self, module: Any) -> OrderedDict[str, TensorMeta]:
        """The tensors in the module's state_dict order, then any the module does not list."""
        out: OrderedDict[str, TensorMeta] = OrderedDict()
        names = [str(k) for k in module] if isinstance(module, Mapping) else []
        for key in names + list(self.tensors):
            if key in self.tensors and key not in out:
                out[key] = self.tensors[key]
        return out


def _optimizer_dict(root: dict[Any, Any], path: str) -> dict[Any, Any]:
    osd = root.get("optimizer_state_dict")
    if not isinstance(osd, Mapping):
        raise InputError("not a DeepSpeed optimizer-states file: no 'optimizer_state_dict' entry", path)
    return dict(osd)


def _stage_and_world(osd: dict[Any, Any], path: str) -> tuple[int, int]:
    stage = osd.get("zero_stage")
    if isinstance(stage, Placeholder):  # ZeroStageEnum(stage), read as an inert placeholder
        stage = stage.args[0] if stage.args else None
    if type(stage) is not int or not 0 <= stage <= 3:
        raise InputError("the optimizer states name no ZeRO stage (zero_stage)", path)
    count = osd.get("partition_count")
    world = max(count) if isinstance(count, list) and count else count
    if type(world) is not int or world < 1:
        raise InputError("the optimizer states name no partition count", path)
    return stage, world


def _shapes(value: Any, what: str, path: str) -> list[tuple[str, tuple[int, ...]]]:
    if not isinstance(value, Mapping):
        raise InputError(f"{what} is not a mapping of parameter shapes", path)
    out = []
    for name, shape in value.items():
        if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
            raise InputError(f"{what} gives {name!r} an invalid shape", path)
        out.append((str(name), shape))
    return out


def _part(t: Any, what: str, path: str) -> Part:
    """A flat 1-D partition or fragment, as the byte range of its storage it covers."""
    if not isinstance(t, LazyTensor) or t.storage is None:
        raise InputError(f"{what} is not a tensor with data", path)
    if len(t.shape) != 1 or (t.shape[0] > 1 and t.stride != (1,)):
        raise InputError(f"{what} is not a flat 1-D tensor", path)
    itemsize = t.dtype.itemsize
    start, n = t.storage_offset * itemsize, t.shape[0]
    if start + n * itemsize > t.storage.nbytes:
        raise InputError(f"{what} reaches past the end of its storage", path)
    return Part(t.storage.source, t.storage.key, start, n)


def _fp32_parts(osd: dict[Any, Any], key: str, rank: int, path: str) -> list[Part]:
    groups = osd.get(key)
    if not isinstance(groups, list):
        raise InputError(f"the optimizer states of rank {rank} have no {key!r} list", path)
    parts = []
    for g, t in enumerate(groups):
        if isinstance(t, LazyTensor) and t.dtype.name != "float32":
            raise InputError(f"{key}[{g}] of rank {rank} is {t.dtype.name}, not float32", path)
        parts.append(_part(t, f"{key}[{g}] of rank {rank}", path))
    return parts


def _trainable_names(m0: dict[Any, Any], path: str) -> list[list[tuple[str, tuple[int, ...]]]]:
    groups = m0.get("param_shapes")
    if isinstance(groups, Mapping):
        groups = [groups]  # very old DeepSpeed: one dict
    if not isinstance(groups, list):
        raise InputError("param_shapes is not a list of parameter groups", path)
    return [_shapes(g, f"param_shapes[{i}]", path) for i, g in enumerate(groups)]


def _shared(m0: dict[Any, Any]) -> dict[str, str]:
    shared = m0.get("shared_params") or {}
    return {str(k): str(v) for k, v in shared.items()} if isinstance(shared, Mapping) else {}


def _buffers(m0: dict[Any, Any], builder: TensorBuilder, reader: StatesReader) -> list[str]:
    module = m0["module"]
    names = [str(n) for n in (m0.get("buffer_names") or [])]
    half = []
    for name in names:
        if name in module:
            builder.saved(name, module[name], "buffer")
            if builder.tensors[name].dtype in ("float16", "bfloat16"):
                half.append(name)
    if half:
        reader.warnings.append(f"buffer(s) {', '.join(half[:5])} are kept in {builder.tensors[half[0]].dtype} as "
                               "saved (DeepSpeed's zero_to_fp32 returns them as float32; add --dtype float32 to "
                               "match)")
    return names


def _ties(m0: dict[Any, Any], builder: TensorBuilder) -> None:
    for tied, source in _shared(m0).items():
        if source in builder.tensors and tied not in builder.tensors:
            builder.tie(tied, source)


def _frozen_note(names: list[str], builder: TensorBuilder, dropped_by_deepspeed: bool, reader: StatesReader) -> None:
    if not names:
        return
    dtypes = sorted({builder.tensors[n].dtype for n in names if n in builder.tensors})
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if dropped_by_deepspeed:
        reader.warnings.append(
            f"frozen parameter(s) {shown} are kept from the model states in {'/'.join(dtypes)}, the dtype they "
            "were trained in; DeepSpeed's zero_to_fp32 leaves them out of ZeRO-1 checkpoints")
    elif any(d != "float32" for d in dtypes):
        reader.warnings.append(
            f"frozen parameter(s) {shown} are {'/'.join(dtypes)}, the dtype they were trained in (only trainable "
            "parameters have fp32 master weights); the trainable ones are float32")


def _zero12(m0: dict[Any, Any], optim: list[dict[Any, Any]], world: int, builder: TensorBuilder,
            reader: StatesReader) -> None:
    path = reader.run.model[0][1]
    module = m0["module"]
    buffers = _buffers(m0, builder, reader)
    groups = _trainable_names(m0, path)
    key = "single_partition_of_fp32_groups"
    per_rank = [_fp32_parts(osd, key, r, reader.run.optim[r][1]) for r, osd in enumerate(optim)]
    paddings = optim[0].get("param_alignment_paddings")
    trainable = set()
    for g, shapes in enumerate(groups):
        if any(len(parts) <= g for parts in per_rank):
            raise InputError(f"parameter group {g} has no fp32 partition on every rank", reader.run.folder)
        pads = paddings[g] if isinstance(paddings, list) and g < len(paddings) else None
        placed = zero2_group(shapes, [parts[g] for parts in per_rank], world, _FP32, pads)
        for name, shape in shapes:
            builder.segments(name, "float32", shape, placed[name], _FP32)
            trainable.add(name)
    frozen_shapes = m0.get("frozen_param_shapes")
    fragments = m0.get("frozen_param_fragments")
    shared = _shared(m0)
    if frozen_shapes is None:
        # ZeRO-1 records no frozen parameters; their full values are in ``module``
        frozen = [str(k) for k in module if str(k) not in trainable and str(k) not in buffers
                  and str(k) not in shared]
        dropped = True
    else:
        frozen = [n for n, _ in _shapes(frozen_shapes, "frozen_param_shapes", path)]
        dropped = False
    for name in frozen:
        value = fragments.get(name) if isinstance(fragments, Mapping) and name in fragments else module.get(name)
        builder.saved(name, value, "frozen parameter")
    _frozen_note(frozen, builder, dropped, reader)
    _ties(m0, builder)


def _zero3(models: list[dict[Any, Any]], optim: list[dict[Any, Any]], builder: TensorBuilder,
           reader: StatesReader) -> None:
    m0 = models[0]
    path = reader.run.model[0][1]
    _buffers(m0, builder, reader)
    frozen_shapes = _shapes(m0.get("frozen_param_shapes") or {}, "frozen_param_shapes", path)
    if frozen_shapes:
        fragments = []
        for r, m in enumerate(models):
            frags = m.get("frozen_param_fragments")
            if not isinstance(frags, Mapping):
                raise InputError(f"rank {r} keeps no frozen_param_fragments", reader.run.model[r][1])
            fragments.append({str(k): _part(v, f"frozen fragment {k!r} of rank {r}", reader.run.model[r][1])
                              for k, v in frags.items()})
        dtypes = {str(k): v.dtype for k, v in m0["frozen_param_fragments"].items() if isinstance(v, LazyTensor)}
        by_dtype: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        for name, shape in frozen_shapes:
            by_dtype.setdefault(dtypes[name].itemsize if name in dtypes else 0, []).append((name, shape))
        for itemsize, shapes in by_dtype.items():
            if itemsize == 0:
                raise InputError(f"no frozen fragment of {shapes[0][0]!r} on rank 0", path)
            placed = zero3_frozen(shapes, fragments, itemsize)
            for name, shape in shapes:
                builder.segments(name, dtypes[name].name, shape, placed[name], itemsize)
    _frozen_note([n for n, _ in frozen_shapes], builder, False, reader)
    shapes = [item for group in _trainable_names(m0, path) for item in group]
    rank_parts = [_fp32_parts(osd, "fp32_flat_groups", r, reader.run.optim[r][1]) for r, osd in enumerate(optim)]
    placed = zero3_params(shapes, rank_parts, _FP32)
    for name, shape in shapes:
        builder.segments(name, "float32", shape, placed[name], _FP32)
    _ties(m0, builder)


def _stage0(m0: dict[Any, Any], builder: TensorBuilder, reader: StatesReader,
            what: str = "no *_optim_states.pt files (ZeRO stage 0): the weights are the module's") -> None:
    """No ZeRO partitions: the module's tensors are the model."""
    module = m0["module"]
    if not isinstance(module, Mapping):
        raise InputError("the model states hold no module state_dict", reader.run.model[0][1])
    for name, value in module.items():
        if isinstance(value, LazyTensor):
            builder.saved(str(name), value, "tensor")
    _ties(m0, builder)
    half = sorted({t.dtype for t in builder.tensors.values() if t.dtype in ("float16", "bfloat16")})
    if half:
        reader.warnings.append(f"{what}, in {'/'.join(half)}; fp32 master weights are not assembled")
