"""DeepSpeed universal checkpoints (``ds_to_universal``'s output) read as the model they hold.

ds_to_universal has already merged every parallelism: the tag folder holds
``zero/<param>/fp32.pt`` per parameter (a pickled dict whose ``param`` is the
whole fp32 tensor, with ``cat_dim``/``vocab_tensor`` notes), ``exp_avg.pt``,
``exp_avg_sq.pt`` and ``step.pt`` beside it (the Adam moments: never read),
``zero/optimizer_state.pt`` and copies of the run's ``mp_rank_XX_model_states.pt``
(their ``module`` and ``param_shapes`` still per tensor-parallel rank). ckpt
reads the keys from ``zero/``, their order from rank 0's ``param_shapes``,
shapes and dtypes from each ``fp32.pt`` pickle (no tensor byte), and buffers
from rank 0's ``module``, which ds_to_universal does not convert.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from math import prod
from typing import Any

from ...errors import InputError
from ...format_names import DeepSpeedLayout, Format
from ...io import SegmentSource, paths
from ...model import TensorMeta, contiguous_strides
from ...pickles.unpickle import LazyTensor
from ..checkpoint import summarize
from ..interface import Loaded, ReadOptions
from ..tp import UC_INFO
from .files import ParallelRun
from .meta import training_dtype
from .ranks import StatesReader, TensorBuilder

STATES = ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt")


def _order(m0: Mapping[Any, Any], names: list[str]) -> list[str]:
    """The model's order as rank 0 recorded it (module, else param_shapes), then any other parameter, sorted."""
    listed: list[str] = []
    module = m0.get("module")
    if isinstance(module, Mapping):
        listed += [str(k) for k in module]
    for group in m0.get("param_shapes") or []:
        if isinstance(group, Mapping):
            listed += [str(k) for k in group]
    have = set(names)
    return list(dict.fromkeys([n for n in listed if n in have] + sorted(names)))


def _shapes(m0: Mapping[Any, Any]) -> dict[str, tuple[int, ...]]:
    """param_shapes by name: a ZeRO-3 run's fp32.pt is flat, and these are the shapes it had."""
    out: dict[str, tuple[int, ...]] = {}
    for group in m0.get("param_shapes") or []:
        if isinstance(group, Mapping):
            out.update({str(k): tuple(v) for k, v in group.items() if isinstance(v, tuple)})
    return out


def read_universal(par: ParallelRun, options: ReadOptions) -> Loaded:
    """Every parameter's ``fp32.pt`` and rank 0's buffers; the optimizer moments described, not read."""
    zero = par.universal or ""
    rank0 = par.ranks[0]
    reader = StatesReader(rank0, options)
    m0 = reader.pickle(rank0.model[0][1])
    entries = paths.listdir(zero)
    names = [n for n in entries if not n.endswith(".pt")]
    if not names:
        raise InputError("the universal checkpoint's zero/ folder holds no parameter folder", zero)
    source = SegmentSource(par.folder, reader.sources)
    builder = TensorBuilder(source, rank0.model[0][1])
    states = _read_parameters(par, _order(m0, names), m0, reader, builder)
    lost = _read_buffers(m0, builder)
    frozen = m0.get("frozen_param_shapes")
    dropped = [str(n) for n in (frozen if isinstance(frozen, Mapping) else ()) if str(n) not in builder.tensors]
    if dropped:
        reader.warnings.append(f"frozen parameter(s) {', '.join(dropped[:5])} are not in the universal checkpoint "
                               "(ds_to_universal leaves out a ZeRO-3 run's frozen parameters); the output lacks them")
    shared = m0.get("shared_params")
    for tied, src in (shared.items() if isinstance(shared, Mapping) else ()):
        if str(src) in builder.tensors:  # one storage, as the model's tie; not the module's copy under two names
            builder.tensors.pop(str(tied), None)
            builder.tie(str(tied), str(src))
    if lost:
        reader.warnings.append(f"buffer(s) {', '.join(lost[:5])} are not in the universal checkpoint "
                               "(ds_to_universal converts parameters only, and this run kept its buffers in "
                               "layer files it does not copy)")
    tensors = builder.ordered(dict.fromkeys(_order(m0, list(builder.tensors))))
    metadata: dict[str, Any] = {
        "deepspeed": _describe(par, m0, list(tensors.values()), entries),
        "optimizer": {"state": {s.removesuffix(".pt"): f"one file per parameter ({n}), not read"
                                for s, n in states.items()}},
    }
    if m0.get(UC_INFO) is not None:
        metadata[UC_INFO] = summarize(m0[UC_INFO])
    return Loaded(Format.DEEPSPEED, tensors, tuple(reader.references), tuple(reader.warnings),
                  (source, *reader.sources), layout="state_dict", metadata=metadata, framework="deepspeed",
                  tensors=tuple(tensors.values()))


def _read_parameters(par: ParallelRun, order: list[str], m0: Mapping[Any, Any], reader: StatesReader,
                     builder: TensorBuilder) -> dict[str, int]:
    """Each parameter's ``zero/NAME/fp32.pt`` into ``builder``; how many parameters have each optimizer state."""
    states: dict[str, int] = {}
    shapes = _shapes(m0)  # a flat fp32.pt (ZeRO-3) takes its recorded shape; a merged one keeps its own
    for name in order:
        folder = paths.join(par.universal or "", name)
        files = set(paths.listdir(folder))
        if "fp32.pt" not in files:
            raise InputError(f"zero/{name}/fp32.pt is missing: the universal checkpoint is incomplete", par.folder)
        for state in STATES[1:]:
            if state in files:
                states[state] = states.get(state, 0) + 1
        root = reader.value(paths.join(folder, "fp32.pt"))  # ZeRO-1/2: {"param": tensor, ...}; ZeRO-3: a flat tensor
        param = root.get("param") if isinstance(root, Mapping) else root
        if not isinstance(param, LazyTensor):
            raise InputError(f"zero/{name}/fp32.pt holds no 'param' tensor", par.folder)
        builder.saved(name, param, "parameter")
        shape = shapes.get(name)
        meta = builder.tensors[name]
        if shape is not None and shape != meta.shape and len(meta.shape) == 1 and prod(shape) == meta.numel \
                and meta.storage is not None and meta.is_contiguous:
            builder.tensors[name] = TensorMeta(name, meta.dtype, shape, contiguous_strides(shape),
                                               meta.storage_offset, meta.storage)
    return states


def _read_buffers(m0: Mapping[Any, Any], builder: TensorBuilder) -> list[str]:
    """Rank 0's buffers as saved (ds_to_universal's fp32.pt of a buffer is module[name].float()); those lost."""
    module = m0.get("module")
    lost = []
    for name in [str(b) for b in (m0.get("buffer_names") or [])]:
        if isinstance(module, Mapping) and name in module:
            builder.saved(name, module[name], "buffer")
        elif name not in builder.tensors:
            lost.append(name)
    return lost


def _describe(par: ParallelRun, m0: Mapping[Any, Any], tensors: list[TensorMeta], entries: list[str]
              ) -> dict[str, Any]:
    """The ``deepspeed`` metadata entry of a universal checkpoint."""
    dims = m0.get("checkpoint_parallel_dimensions")
    info: dict[str, Any] = {
        "layout": str(DeepSpeedLayout.UNIVERSAL),
        "zero_stage": "universal",
        "world_size": int(m0.get("dp_world_size") or 1),
        "dtype": training_dtype(m0, tensors),
        "tag": par.tag or paths.basename(par.folder if paths.is_url(par.folder) else os.path.abspath(par.folder)),
        "folder": par.folder,
        # the files DeepSpeed's loader opens with torch.load besides one fp32.pt per parameter
        "files": [paths.basename(p) for r in par.ranks for _, p in r.model]
        + (["zero/optimizer_state.pt"] if "optimizer_state.pt" in entries else []),
    }
    if isinstance(dims, Mapping):
        info.update(pp=dims.get("pp_degree"), tp=dims.get("tp_degree"))
    for key in ("global_steps", "ds_version"):
        if key in m0:
            info[key] = summarize(m0[key])
    return info
