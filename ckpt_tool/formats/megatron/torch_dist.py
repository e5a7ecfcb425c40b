"""Megatron-core ``torch_dist`` checkpoints: a DCP folder, plus ``common.pt`` and ``metadata.json``.

Megatron saves a homogeneous model's layers stacked on a leading axis
(``decoder.layers.mlp.linear_fc1.weight [L, 2F, H]``, axis 0 = the global
layer number) and MoE experts on the next one
(``decoder.layers.mlp.experts.linear_fc1.weight [L, E, F, H]``); its
``_extra_state`` objects are bytes items named ``KEY/shard_<offsets>_<shape>``.
``unstack`` turns such a folder into Megatron's per-layer names
(``decoder.layers.0.mlp.linear_fc1.weight``, experts as SequentialMLP names
them: ``...mlp.experts.local_experts.3.linear_fc1.weight``), what
``model.state_dict()`` of a TP=1 model holds. Each per-layer tensor is a
contiguous byte range of its stacked tensor, so nothing is copied or held:
the per-layer keys read (and stream) through the stacked one.

Tensor-, pipeline- and expert-parallel saves need nothing more: every rank's
pieces sit at their global offsets in ``.metadata`` (a TP=2 weight reads as
the TP=1 one; a PP stage's layers as rows of the one stack, numbered with
Megatron's layer offset).

``common.pt`` (torch.save: iteration, args, ...) is read by the restricted
unpickler like any torch file; ``metadata.json`` is plain JSON. A
DistributedOptimizer's ``fully_reshardable`` state is one tensor per
parameter (unstacked like it); its ``dp_reshardable`` buckets are flat over
many parameters with no saved map, so they are kept as saved and said.
"""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ... import dtypes
from ...errors import CkptError, InputError, UsageError
from ...io import paths
from ...model import DataSource, StorageRef, TensorMeta, contiguous_strides
from ..dcp import BytesItem
from ..interface import Loaded, ReadOptions

COMMON, METADATA_JSON = "common.pt", "metadata.json"
_MAX_JSON = 1 << 20
# KEY stacked: "...decoder.layers." (or encoder.) followed by a name, not a layer number
_STACKED = re.compile(r"^(?P<head>(?:.*\.)?(?:decoder|encoder)\.layers\.)(?P<rest>(?!\d+\.)[^/]+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(?:experts\.)?(?P<rest>linear_fc[12]\.[^/]+)$")
_SHARD = re.compile(r"^(?P<key>[^/]+)/shard_(?P<offsets>[\d.]+)_(?P<shape>[\d.]+)$")
_PER_LAYER = re.compile(r"^(?P<head>(?:.*\.)?(?:decoder|encoder)\.layers\.)(?P<layer>\d+)\.")
_FLAT_OPTIMIZER = "optimizer.distributed."  # dp_reshardable, dp_zero_gather_scatter: per-DP-rank buffers
_PER_PARAM_OPTIMIZER = "optimizer.state."  # fully_reshardable: optimizer.state.<state>.<parameter key>


def _metadata_json(folder: str) -> Any:
    path = paths.join(folder, METADATA_JSON)
    if not paths.isfile(path):
        return None
    with paths.open_bytes(path) as data:
        if data.size > _MAX_JSON:
            raise InputError(f"{METADATA_JSON} is {data.size} bytes: not Megatron's small JSON file", folder)
        raw = data.read(0, data.size)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InputError(f"{METADATA_JSON} is not JSON", folder) from None


def describe(loaded: Loaded, folder: str, options: ReadOptions) -> Loaded:
    """The DCP folder's result with what Megatron keeps beside the DCP files: metadata.json, common.pt (never
    executed), the stacking.

    A DCP folder whose ``metadata.json`` does not name the torch_dist backend is left as it is.
    """
    from ..checkpoint import summarize
    from ..torchsave import read_torch_zip

    found = _metadata_json(folder)
    if not (isinstance(found, dict) and found.get("sharded_backend") == "torch_dist"):
        return loaded
    info: dict[str, Any] = {METADATA_JSON: found}
    references, warnings = list(loaded.references), list(loaded.warnings)
    common = paths.join(folder, COMMON)
    if paths.isfile(common):
        try:
            part = read_torch_zip(common, options)
        except CkptError as exc:
            raise InputError(f"{COMMON}: {exc.message}", folder) from None
        references.extend(part.references)
        warnings.extend(f"{COMMON}: {w}" for w in part.warnings)
        info[COMMON] = summarize(part.root)
        parallel = _parallel(info[COMMON])
        if parallel:
            info["parallel"] = parallel
        for source in part.sources:
            source.close()
    stacked = _stacked_layers(loaded.root)
    if stacked:
        info["stacked_layers"] = stacked
        warnings.append(
            f"Megatron torch_dist: layers are stacked on a leading axis ({stacked} layers, e.g. "
            f"{next(k for k in loaded.root if _STACKED.match(k))!r}); a Megatron model's state_dict names them "
            "per layer: add --unstack-layers (inspect and migrate)")
    warnings.extend(_describe_optimizer(loaded.root, info))
    return replace(loaded, references=tuple(references), warnings=tuple(warnings), framework="megatron",
                   metadata={**loaded.metadata, "megatron": info})


def _describe_optimizer(root: Any, info: dict[str, Any]) -> list[str]:
    """Name the DistributedOptimizer's format in ``info``; say plainly (the warnings returned) when its state stays
    flat, and why."""
    kind = _find(info.get(COMMON), "param_state_sharding_type", 3)
    flat = [str(k) for k in root if str(k).startswith(_FLAT_OPTIMIZER)]
    per_param = any(str(k).startswith(_PER_PARAM_OPTIMIZER) for k in root)
    if kind is None and not flat and not per_param:
        return []
    if not flat:  # fully_reshardable (fully_sharded_model_space): one tensor per parameter and state
        info["distributed_optimizer"] = {"sharding_type": kind, "state": "per parameter (optimizer.state.*)"}
        return []
    tensors = [k for k in flat if isinstance(root[k], TensorMeta)]
    buckets = sorted({k.rsplit(".", 1)[0] for k in tensors})
    example = (tensors or flat)[0]
    info["distributed_optimizer"] = {"sharding_type": kind, "state": "flat buckets (optimizer.distributed.*), "
                                     "kept as saved", "buckets": len(buckets)}
    return [
        f"Megatron distributed-optimizer state saved as {kind or 'flat per-DP-rank buffers'}: {len(flat)} "
        f"entries under {_FLAT_OPTIMIZER}* ("
        + (f"{len(buckets)} flat per-rank bucket(s)" if buckets
           else "pickled objects: flat buffers gathered on DP rank 0")
        + f", e.g. {example!r}) hold the fp32 main parameters and "
        "Adam moments of many parameters end to end, padded; which range is which parameter is not saved (a "
        "DistributedOptimizer recomputes it from the model it wraps), so they are kept as saved, not split into "
        "parameters or unstacked; --drop 'optimizer.*' leaves them out. A run saved with sharding_type "
        f"'fully_reshardable' holds one tensor per parameter ({_PER_PARAM_OPTIMIZER}<param|exp_avg|exp_avg_sq>."
        "<parameter>), unstacked like the parameters"]


_PARALLEL = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
             "ep": "expert_model_parallel_size"}


def _parallel(common: Any) -> dict[str, int] | None:
    """The parallelism Megatron-LM's ``args`` (saved in common.pt) records: what the run was, not what it needs."""
    args = common.get("args") if isinstance(common, Mapping) else None
    if not isinstance(args, Mapping):
        return None
    found = {k: args[v] for k, v in _PARALLEL.items() if isinstance(args.get(v), int)}
    return found or None


def _find(tree: Any, name: str, depth: int) -> str | None:
    """``tree[...][name]`` at most ``depth`` levels down (a ChainedOptimizer nests one state per optimizer)."""
    if not isinstance(tree, Mapping) or depth < 0:
        return None
    if isinstance(tree.get(name), str):
        return str(tree[name])
    return next((f for v in tree.values() if (f := _find(v, name, depth - 1)) is not None), None)


def _stacked_layers(root: Any) -> int | None:
    if not isinstance(root, Mapping):
        return None
    sizes = {t.shape[0] for k, t in root.items() if isinstance(t, TensorMeta) and t.shape and _STACKED.match(k)}
    return max(sizes) if sizes else None


class UnstackedSource(DataSource):
    """Per-layer tensors as byte ranges of the stacked tensors they were saved in."""

    def __init__(self, inner: DataSource) -> None:
        self.path = inner.path
        self.inner = inner
        self.where: dict[str, tuple[str, int]] = {}  # per-layer key -> (stacked key, byte offset)

    def read(self, key: str, offset: int, length: int) -> bytes:
        stacked, base = self.where[key]
        return self.inner.read(stacked, base + offset, length)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        stacked, base = self.where[key]
        self.inner.read_into(stacked, base + offset, out)

    def file_pieces(self, key: str, offset: int, length: int) -> list[Any] | None:
        get = getattr(self.inner, "file_pieces", None)
        stacked, base = self.where[key]
        return get(stacked, base + offset, length) if get is not None else None

    def close(self) -> None:
        self.inner.close()


def unstack(loaded: Loaded, path: str) -> Loaded:
    """A Megatron folder's result with its stacked layers (and experts) under per-layer keys."""
    info = loaded.metadata.get("megatron")
    root = loaded.root
    if not isinstance(info, dict) or not isinstance(root, Mapping):
        raise UsageError(f"--unstack-layers reads a Megatron-core torch_dist checkpoint (a DCP folder with "
                         f"{METADATA_JSON}); this is {loaded.format}", path)
    layers = info.get("stacked_layers")
    # Megatron's state_dict order: the stack's place holds layer 0's entries, then layer 1's, ...
    order: list[tuple[str, Any] | str] = []
    stacks: dict[str, dict[int, list[tuple[str, Any]]]] = {}
    sources: dict[int, UnstackedSource] = {}
    for key, value in root.items():
        for new_key, new_value in _split(str(key), value, layers, sources, path):
            m = _PER_LAYER.match(new_key)
            if m is None:
                order.append((new_key, new_value))
                continue
            if m.group("head") not in stacks:
                order.append(m.group("head"))
            stacks.setdefault(m.group("head"), {}).setdefault(int(m.group("layer")), []).append((new_key, new_value))
    out: OrderedDict[str, Any] = OrderedDict()
    for item in order:
        for new_key, new_value in ([item] if isinstance(item, tuple)
                                   else [e for n in sorted(stacks[item]) for e in stacks[item][n]]):
            if new_key in out:
                raise InputError(f"unstacking gives two entries the key {new_key!r}", path)
            out[new_key] = new_value
    added = tuple(s for s in sources.values() if s not in loaded.sources)
    return replace(loaded, root=out, sources=loaded.sources + added,
                   warnings=tuple(w for w in loaded.warnings if "--unstack-layers" not in w),
                   metadata={**loaded.metadata, "megatron": {**info, "unstacked": True}})


def _split(key: str, value: Any, layers: int | None, sources: dict[int, UnstackedSource],
           path: str) -> list[tuple[str, Any]]:
    """The per-layer entries of one entry (itself when it is not stacked)."""
    if isinstance(value, BytesItem):
        return [(_object_key(key, path), value)]
    m = _STACKED.match(key)
    if m is None or not isinstance(value, TensorMeta) or value.storage is None:
        return [(key, value)]
    if not value.shape or value.shape[0] != layers:
        raise InputError(f"stacked tensor {key!r} has {value.shape[:1] or 'no'} leading layers, the others "
                         f"{layers}: not one homogeneous stack", path)
    head, rest = m.group("head"), m.group("rest")
    expert = _EXPERT.match(rest)
    axes = 2 if expert else 1
    if len(value.shape) < axes:
        return [(key, value)]
    inner = value.storage.source
    source = sources.setdefault(id(inner), UnstackedSource(inner))
    shape = value.shape[axes:]
    per = dtypes.BY_NAME[value.dtype].itemsize
    for d in shape:
        per *= d
    out = []
    count = value.shape[0] * (value.shape[1] if expert else 1)
    for i in range(count):
        layer, e = divmod(i, value.shape[1]) if expert else (i, 0)
        name = f"{head}{layer}.mlp.experts.local_experts.{e}.{expert.group('rest')}" if expert \
            else f"{head}{layer}.{rest}"
        source.where[name] = (value.storage.key, i * per)
        out.append((name, TensorMeta(name, value.dtype, shape, contiguous_strides(shape), 0,
                                     StorageRef(source, name, per), value.device)))
    return out


def _object_key(key: str, path: str) -> str:
    """A ShardedObject's per-layer name: ``decoder.layers.mlp.linear_fc1._extra_state/shard_1_2`` is layer 1's."""
    m = _SHARD.match(key)
    if m is None:
        return key
    base = m.group("key")
    offsets = [int(x) for x in m.group("offsets").split(".")]
    shape = [int(x) for x in m.group("shape").split(".")]
    stacked = _STACKED.match(base)
    if stacked is None:
        return base if all(d == 1 for d in shape) else key
    head, rest = stacked.group("head"), stacked.group("rest")
    expert = _EXPERT.match(rest)
    if expert and len(offsets) >= 2:
        return f"{head}{offsets[0]}.mlp.experts.local_experts.{offsets[1]}.{expert.group('rest')}"
    return f"{head}{offsets[0]}.{rest}"
