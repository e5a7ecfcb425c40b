"""Where one rank's piece of a DTensor or ShardedTensor lies in the global tensor, from its pickle alone.

The restricted unpickler keeps a DTensor or ShardedTensor as a placeholder
of its class holding ``_rebuild_wrapper_subclass``'s arguments (global dtype,
size, stride) and the object's state (pickles/unpickle/rebuilders.py):

- a DTensor's state is its ``_local_tensor`` and ``_spec`` (DTensorSpec: the
  DeviceMesh with this rank's ``_rank`` and ``_coordinate_on_dim``, its
  ``_layout`` giving the mesh shape, and one placement per mesh dimension).
  The block a rank holds is what torch's
  ``_compute_local_shape_and_global_offset`` gives: each ``Shard(d)`` cuts
  the current extent of dimension ``d`` in ``torch.chunk`` pieces, mesh
  dimensions left to right; ``Replicate()`` keeps it whole;
- a ShardedTensor's state is ``(local_shards, metadata, pg_state, spec,
  init_rrefs)``: each local shard's tensor with its offsets and sizes, the
  global list of every shard, and the writer's global rank and world size.

Nothing here reads tensor bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import dtypes
from ...errors import InputError
from ...model import contiguous_strides
from ...pickles.unpickle import DTypeRef, LazyTensor, Placeholder

DTENSOR = "DTensor"
SHARDED_TENSOR = "ShardedTensor"
PLAIN = "tensor"


@dataclass(frozen=True)
class Block:
    """A rank's box of the global tensor and the local tensor that holds its elements in C order."""

    rank: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    local: LazyTensor

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(frozen=True)
class Piece:
    """What one rank file holds for one key."""

    kind: str  # DTENSOR, SHARDED_TENSOR or PLAIN
    dtype: str
    shape: tuple[int, ...]
    blocks: tuple[Block, ...]
    placement: str  # as a person reads it: "Shard(0)", "Replicate()", "ShardedTensor", "tensor"
    rank: int | None  # the writer's global rank, as the pickle says (None: a plain tensor says nothing)
    world: int | None  # the world size (DTensor: the mesh's size)
    mesh: tuple[int, ...] | None = None


def is_distributed(value: Any) -> str | None:
    """DTENSOR or SHARDED_TENSOR for the unpickler's record of one, else None."""
    if isinstance(value, Placeholder):
        name = value._ckpt_name
        if name == DTENSOR and value._ckpt_module.startswith("torch.distributed.tensor"):
            return DTENSOR
        if name == SHARDED_TENSOR and value._ckpt_module.startswith("torch.distributed._shard.sharded_tensor"):
            return SHARDED_TENSOR
    return None


def piece(key: str, value: Any, rank_hint: int, path: str) -> Piece | None:
    """The piece ``value`` is (None: not a tensor). ``rank_hint`` places a plain tensor."""
    if isinstance(value, LazyTensor):
        _check_local(key, value, path)
        return Piece(PLAIN, value.dtype.name, value.shape,
                     (Block(rank_hint, (0,) * len(value.shape), value.shape, value),), PLAIN, None, None)
    kind = is_distributed(value)
    if kind is None:
        return None
    if not isinstance(value, Placeholder):  # is_distributed said it is one; narrows the type
        return None
    dtype, shape = _global(key, value, path)
    if kind == DTENSOR:
        return _dtensor(key, value, dtype, shape, path)
    return _sharded(key, value, dtype, shape, path)


def _global(key: str, value: Placeholder, path: str) -> tuple[str, tuple[int, ...]]:
    args = value.args
    if len(args) < 2 or not isinstance(args[0], DTypeRef) or not _dims(args[1]):
        raise InputError(f"the {value._ckpt_name} {key!r} does not give a global dtype and size", path)
    if args[0].name not in dtypes.BY_NAME:
        raise InputError(f"the {value._ckpt_name} {key!r} has a dtype ckpt does not know ({args[0].name!r})", path)
    return args[0].name, tuple(args[1])


def _ints(v: Any) -> tuple[int, ...] | None:
    """A ShardMetadata's offsets or sizes (pickled as lists) as a tuple, None when they are not counts."""
    return tuple(v) if isinstance(v, (list, tuple)) and _dims(tuple(v)) else None


def _dims(v: Any) -> bool:
    return isinstance(v, tuple) and all(type(d) is int and d >= 0 for d in v)


def _check_local(key: str, t: LazyTensor, path: str) -> None:
    if t.storage is None:
        raise InputError(f"the local tensor of {key!r} has no data (saved on the meta device?)", path)
    if t.shape and any(d > 1 for d in t.shape) and t.stride != contiguous_strides(t.shape) and \
            any(d != 1 and s != w for d, s, w in zip(t.shape, t.stride, contiguous_strides(t.shape), strict=True)):
        raise InputError(f"the local tensor of {key!r} is not stored contiguously", path)


def _attrs(obj: Any) -> dict[str, Any]:
    return obj.attributes if isinstance(obj, Placeholder) else {}


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _mesh_shape(layout: Any) -> tuple[int, ...] | None:
    axes = _attrs(layout).get("axes")
    if not isinstance(axes, tuple) or not axes:
        return None
    out = []
    for axis in axes:
        shape = _attrs(axis).get("shape")
        flat = _flatten(shape)
        if flat is None:
            return None
        n = 1
        for d in flat:
            n *= d
        out.append(n)
    return tuple(out)


def _flatten(v: Any) -> list[int] | None:
    if type(v) is int:
        return [v]
    if isinstance(v, tuple):
        out: list[int] = []
        for x in v:
            inner = _flatten(x)
            if inner is None:
                return None
            out.extend(inner)
        return out
    return None


def describe(p: Any) -> str:
    """A placement as torch prints it."""
    name = p._ckpt_name if isinstance(p, Placeholder) else type(p).__name__
    a = _attrs(p)
    if name in ("Shard", "_StridedShard"):
        extra = f", split_factor={a.get('split_factor')}" if name == "_StridedShard" else ""
        return f"{name}({a.get('dim')}{extra})" if not extra else f"{name}(dim={a.get('dim')}{extra})"
    return f"{name}()"


def _dtensor(key: str, value: Placeholder, dtype: str, shape: tuple[int, ...], path: str) -> Piece:
    state = value.attributes
    local, spec = state.get("_local_tensor"), _attrs(state.get("_spec"))
    if not isinstance(local, LazyTensor):
        raise InputError(f"the DTensor {key!r} holds no local tensor ckpt can read", path)
    _check_local(key, local, path)
    mesh = _attrs(spec.get("mesh"))
    mesh_shape = _mesh_shape(mesh.get("_layout"))
    coord, rank = mesh.get("_coordinate_on_dim"), _int(mesh.get("_rank"))
    placements = spec.get("placements")
    if mesh_shape is None or rank is None or not isinstance(coord, tuple) or len(coord) != len(mesh_shape) \
            or not all(type(c) is int and 0 <= c < n for c, n in zip(coord, mesh_shape, strict=True)):
        raise InputError(f"the DTensor {key!r} does not say its device mesh and this rank's place in it", path)
    if not isinstance(placements, tuple) or len(placements) != len(mesh_shape):
        raise InputError(f"the DTensor {key!r} does not give one placement per mesh dimension", path)
    shown = ", ".join(describe(p) for p in placements)
    offsets, sizes = _box(key, shape, placements, mesh_shape, coord, spec, shown, path)
    if tuple(sizes) != local.shape:
        raise InputError(f"rank {rank}'s local tensor of {key!r} is {list(local.shape)}, but its placement "
                         f"[{shown}] over a mesh of {list(mesh_shape)} gives {sizes} of the global {list(shape)}: "
                         "the shards do not tile the global tensor", path)
    # a DTensor on a sub-mesh (FSDP2's dp mesh of a dp x tp run) names its root mesh: the run's world
    root = _mesh_shape(_attrs(mesh.get("_root_mesh")).get("_layout")) or mesh_shape
    world = 1
    for n in root:
        world *= n
    return Piece(DTENSOR, dtype, shape, (Block(rank, tuple(offsets), tuple(sizes), local),), f"[{shown}]",
                 rank, world, mesh_shape)


_WHY = {"Partial": " (sums each rank still has to reduce: save full_tensor() or redistribute first)"}


def _box(key: str, shape: tuple[int, ...], placements: tuple[Any, ...], mesh_shape: tuple[int, ...],
         coord: tuple[int, ...], spec: dict[str, Any], shown: str, path: str) -> tuple[list[int], list[int]]:
    """(offsets, sizes) of the block this rank holds, as torch's _compute_local_shape_and_global_offset places it.

    Each tensor dimension is followed as the runs of global indices the rank keeps (mesh dimensions left to
    right): Shard(d) keeps torch.chunk's piece of them; _StridedShard(d, split_factor=f) (FSDP2 over a
    tensor-parallel split of the same dimension) first cuts them in f pieces and keeps its chunk of each. The
    result must be one run per dimension (it is, for the placements FSDP2 + TP write), a box of the tensor.
    """
    runs: dict[int, list[range]] = {}
    sharded_dims: list[int] = []
    for i, p in enumerate(placements):
        name = p._ckpt_name if isinstance(p, Placeholder) else ""
        if name == "Replicate":
            continue
        a = _attrs(p)
        dim = _int(a.get("dim"))
        factor = _int(a.get("split_factor")) if name == "_StridedShard" else 1
        if name not in ("Shard", "_StridedShard") or dim is None or not -len(shape) <= dim < len(shape) \
                or factor is None or factor < 1:
            raise InputError(f"the DTensor {key!r} is placed [{shown}]: ckpt consolidates Shard(d), "
                             f"_StridedShard(d) and Replicate() placements, not {describe(p)}{_WHY.get(name, '')}",
                             path)
        dim %= len(shape)
        if name == "Shard" and dim in sharded_dims:  # two mesh dims on one tensor dim: the spec's shard_order
            _check_order(key, spec.get("shard_order"), shown, path)
        sharded_dims.append(dim)
        held = runs.get(dim, [range(shape[dim])])
        total = sum(len(r) for r in held)
        kept: list[range] = []
        for part_start, part_size in (_chunk(total, factor, j) for j in range(factor)):
            start, size = _chunk(part_size, mesh_shape[i], coord[i])
            kept += _slice(held, part_start + start, size)
        runs[dim] = _merged(kept)
    offsets, sizes = [0] * len(shape), list(shape)
    for dim, held in runs.items():
        if len(held) > 1:
            raise InputError(f"the DTensor {key!r} is placed [{shown}]: this rank's elements of dimension {dim} "
                             "are not one block of the global tensor, which ckpt does not consolidate yet", path)
        offsets[dim], sizes[dim] = (held[0].start, len(held[0])) if held else (0, 0)
    return offsets, sizes


def _slice(runs: list[range], start: int, size: int) -> list[range]:
    """The runs of indices at positions [start, start + size) of the concatenated ``runs``."""
    out: list[range] = []
    pos = 0
    for r in runs:
        lo, hi = max(start, pos), min(start + size, pos + len(r))
        if lo < hi:
            out.append(r[lo - pos : hi - pos])
        pos += len(r)
    return out


def _merged(runs: list[range]) -> list[range]:
    """Adjacent runs joined (r1 ends where r2 starts)."""
    out: list[range] = []
    for r in runs:
        if out and out[-1].stop == r.start:
            out[-1] = range(out[-1].start, r.stop)
        elif len(r):
            out.append(r)
    return out


def _chunk(size: int, n: int, index: int) -> tuple[int, int]:
    """torch.chunk's piece ``index`` of ``n`` of a dimension of ``size`` (Shard.local_shard_size_and_offset)."""
    full = -(-size // n) if size else 0
    start = min(full * index, size)
    return start, min(full * (index + 1), size) - start


def _check_order(key: str, order: Any, shown: str, path: str) -> None:
    entries = order if isinstance(order, tuple) else ()
    for e in entries:
        dims = e[1] if isinstance(e, tuple) and len(e) == 2 else _attrs(e).get("mesh_dims")
        if isinstance(dims, tuple) and list(dims) != sorted(dims):
            raise InputError(f"the DTensor {key!r} is placed [{shown}] with mesh dimensions applied out of "
                             "order (shard_order): ckpt does not consolidate that yet", path)


def _sharded(key: str, value: Placeholder, dtype: str, shape: tuple[int, ...], path: str) -> Piece:
    state = value.state
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[0], list)):
        raise InputError(f"the ShardedTensor {key!r} has a state ckpt does not know", path)
    local_shards, meta, pg = state[0], _attrs(state[1]), _attrs(state[2])
    rank, world = _int(pg.get("global_rank")), _int(pg.get("global_world_size"))
    if rank is None or world is None:
        raise InputError(f"the ShardedTensor {key!r} does not say which rank saved it", path)
    size = meta.get("size")
    if not isinstance(size, tuple) or size != shape:
        raise InputError(f"the ShardedTensor {key!r} gives two global sizes ({size} and {list(shape)})", path)
    blocks = []
    for shard in local_shards:
        a = _attrs(shard)
        t, sm = a.get("tensor"), _attrs(a.get("metadata"))
        offsets, sizes = _ints(sm.get("shard_offsets")), _ints(sm.get("shard_sizes"))
        if not isinstance(t, LazyTensor) or offsets is None or sizes is None \
                or len(offsets) != len(shape) or len(sizes) != len(shape):
            raise InputError(f"a local shard of the ShardedTensor {key!r} is not a tensor with offsets and sizes",
                             path)
        _check_local(key, t, path)
        if sizes != t.shape:
            raise InputError(f"rank {rank}'s shard of {key!r} is {list(t.shape)}, but its metadata says "
                             f"{list(sizes)}", path)
        blocks.append(Block(rank, offsets, sizes, t))
    return Piece(SHARDED_TENSOR, dtype, shape, tuple(blocks), SHARDED_TENSOR, rank, world)


def global_shards(value: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every shard a ShardedTensor's global metadata lists, as (offsets, sizes)."""
    state = value.state if isinstance(value, Placeholder) else None
    meta = _attrs(state[1]) if isinstance(state, tuple) and len(state) > 1 else {}
    out = []
    for sm in meta.get("shards_metadata") or []:
        a = _attrs(sm)
        offsets, sizes = _ints(a.get("shard_offsets")), _ints(a.get("shard_sizes"))
        if offsets is not None and sizes is not None:
            out.append((offsets, sizes))
    return out
