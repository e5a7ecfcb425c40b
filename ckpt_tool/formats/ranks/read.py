"""A folder of per-rank torch.save files (verl, FSDP2 ``state_dict()``, FSDP1 SHARDED_STATE_DICT) as one model.

Each rank file is read like any torch.save zip (its pickle by the restricted
unpickler, which keeps DTensors and ShardedTensors as records: no process
group, nothing run); placement.py says where each rank's piece lies,
tiling.py checks that the pieces cover every tensor exactly once, and
source.py reads the consolidated bytes from the rank files when data is
needed. The checks, before anything is listed: one file per rank of the
world the pickles name, the same keys, dtypes and global shapes in every
file, and (verl) the ranks the names say.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ... import dtypes
from ...errors import InputError
from ...format_names import Format
from ...io import paths
from ...model import DataSource, GlobalRef, StorageRef, TensorMeta, contiguous_strides
from ...pickles.torch_rules import inputs as wo_input
from ..checkpoint import join_walk, needs_walk
from ..interface import FormatReader, Loaded, ReadOptions
from ..torchsave import read_torch_zip
from .files import RankFiles, rank_files
from .placement import PLAIN, Block, Piece, global_shards, is_distributed, piece
from .source import RanksSource
from .tiling import tile

_SHOWN = 5  # keys named in a message


@dataclasses.dataclass
class _Rank:
    name: str
    loaded: Loaded
    rank: int
    world: int
    pieces: dict[str, Piece]
    kinds: set[str]
    raw: dict[str, Any]  # each key's record as unpickled (a ShardedTensor's global shard list)


def read_ranks(path: str, options: ReadOptions) -> Loaded:
    """Every rank file of the folder, checked and consolidated as metadata (no tensor byte read)."""
    found = rank_files(path)
    if not found.names:
        raise InputError("folder holds no per-rank torch.save file of DTensors or ShardedTensors", path)
    wo = dataclasses.replace(options, walk=False)
    ranks: list[_Rank] = []
    skipped = list(found.skipped)
    inner: list[DataSource] = []
    try:
        for i, name in enumerate(found.names):
            loaded = read_torch_zip(paths.join(path, name), wo)
            if options.walk and needs_walk(loaded):  # how each global is used (FSDP1's getattr): the walk's verdict
                loaded = join_walk(loaded, paths.join(path, name), options.limits)
            inner.extend(loaded.sources)
            r = _rank(name, loaded, found, i, path)
            if r is None:
                skipped.append(name)
            else:
                ranks.append(r)
        return _consolidate(path, found, ranks, sorted(skipped), inner)
    except BaseException:
        for s in inner:
            s.close()
        raise


def _flat(root: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, leaf) of nested dicts, in order; tensors and their records are leaves."""
    out: list[tuple[str, Any]] = []
    for k, v in root.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and all(isinstance(x, str) for x in v):
            out.extend(_flat(v, key + "."))
        else:
            out.append((key, v))
    return out


def _rank(name: str, loaded: Loaded, found: RankFiles, index: int, folder: str) -> _Rank | None:
    """One file's pieces and the rank it says it is (None: not a rank file, when names do not say so)."""
    where = paths.join(folder, name)
    if not isinstance(loaded.root, Mapping):
        if found.verl:
            raise InputError(f"{name} holds a {type(loaded.root).__name__}, not a state dict", folder)
        return None
    leaves = _flat(loaded.root)
    if not any(is_distributed(v) for _, v in leaves):
        if found.verl:
            raise InputError(f"{name} holds no DTensor or ShardedTensor: not one rank's model state", folder)
        return None
    named = found.named_ranks[index] if found.verl else None
    hint = named[1] if named else -1
    pieces = {}
    for key, v in leaves:
        p = piece(key, v, hint, where)
        if p is not None:
            pieces[key] = p
    said = {(p.rank, p.world) for p in pieces.values() if p.rank is not None}
    if len(said) != 1:
        raise InputError(f"{name} holds tensors of several ranks or worlds ({sorted(said)})", folder)
    rank, world = said.pop()
    if rank is None or world is None:
        raise InputError(f"{name} does not say which rank saved it", folder)
    if named is not None and named != (world, rank):
        raise InputError(f"{name} is named rank {named[1]} of {named[0]}, but its tensors were saved by rank "
                         f"{rank} of {world}", folder)
    kinds = {p.kind for p in pieces.values() if p.kind != PLAIN}
    if hint < 0:  # plain tensors take the rank the file's DTensors say
        pieces = {k: (dataclasses.replace(p, blocks=(dataclasses.replace(p.blocks[0], rank=rank),))
                      if p.kind == PLAIN else p) for k, p in pieces.items()}
    return _Rank(name, loaded, rank, world, pieces, kinds, {k: v for k, v in leaves if k in pieces})


def _keys_shown(keys: set[str]) -> str:
    shown = sorted(keys)
    return ", ".join(repr(k) for k in shown[:_SHOWN]) + (f" and {len(shown) - _SHOWN} more" if len(shown) > _SHOWN
                                                        else "")


def _check_world(folder: str, ranks: list[_Rank]) -> int:
    worlds = {r.world for r in ranks}
    if len(worlds) != 1:
        raise InputError(f"the rank files come from runs of different world sizes ({sorted(worlds)})", folder)
    world = worlds.pop()
    by_rank: dict[int, str] = {}
    for r in ranks:
        if r.rank in by_rank:
            raise InputError(f"{by_rank[r.rank]} and {r.name} were both saved by rank {r.rank}", folder)
        by_rank[r.rank] = r.name
    missing = sorted(set(range(world)) - set(by_rank))
    if missing or len(ranks) != world:
        shown = ", ".join(str(m) for m in missing[:_SHOWN]) + (" ..." if len(missing) > _SHOWN else "")
        raise InputError(f"rank(s) {shown} of {world} missing: the folder holds {len(ranks)} rank file(s) "
                         f"({', '.join(r.name for r in sorted(ranks, key=lambda r: r.rank)[:_SHOWN])}), the "
                         f"save had {world}; copy every rank's file", folder)
    return world


def _check_keys(folder: str, ranks: list[_Rank]) -> None:
    first = ranks[0]
    want = set(first.pieces)
    for r in ranks[1:]:
        have = set(r.pieces)
        if have != want:
            extra, lack = have - want, want - have
            said = "; ".join(s for s in (f"holds {_keys_shown(extra)}" if extra else "",
                                         f"lacks {_keys_shown(lack)}" if lack else "") if s)
            raise InputError(f"the rank files do not hold the same keys: rank {r.rank}'s {r.name} {said}, "
                             f"unlike rank {first.rank}'s {first.name}", folder)


def _consolidate(folder: str, found: RankFiles, ranks: list[_Rank], skipped: list[str],
                 inner: list[DataSource]) -> Loaded:
    if not ranks:
        raise InputError("folder holds no per-rank torch.save file of DTensors or ShardedTensors", folder)
    world = _check_world(folder, ranks)
    ranks.sort(key=lambda r: r.rank)
    _check_keys(folder, ranks)
    source = RanksSource(folder, inner)
    metas: dict[str, TensorMeta] = {}
    meshes: set[tuple[int, ...]] = set()
    placements: dict[str, int] = {}
    replicated: list[str] = []
    for key, p0 in ranks[0].pieces.items():
        blocks: list[Block] = []
        for r in ranks:
            p = r.pieces[key]
            if (p.kind, p.dtype, p.shape) != (p0.kind, p0.dtype, p0.shape):
                raise InputError(f"tensor {key!r} is a {p0.dtype} {p0.kind} {list(p0.shape)} in rank {ranks[0].rank}'s "
                                 f"{ranks[0].name} but a {p.dtype} {p.kind} {list(p.shape)} in rank {r.rank}'s "
                                 f"{r.name}", folder)
            if p.mesh is not None:
                meshes.add(p.mesh)
            blocks.extend(p.blocks)
        where = paths.join(folder, ranks[0].name)
        tiled = tile(key, p0.shape, blocks, where)
        _check_global_shards(key, ranks, tiled.blocks, folder)
        if tiled.replicas:
            replicated.append(key)
        placements[p0.placement] = placements.get(p0.placement, 0) + 1
        dt = dtypes.BY_NAME[p0.dtype]
        source.add(key, dt, p0.shape, tiled)
        nbytes = dt.itemsize
        for d in p0.shape:
            nbytes *= d
        metas[key] = TensorMeta(key, p0.dtype, p0.shape, contiguous_strides(p0.shape), 0,
                                StorageRef(source, key, nbytes), "cpu")
    # several meshes: sub-meshes of one run (FSDP2 on the dp mesh of a dp x tp run; their pieces tile above)
    shown_mesh = max(meshes, key=lambda m: (len(m), m)) if meshes else None
    root = _rebuild(ranks[0].loaded.root, metas)
    kinds = sorted({k for r in ranks for k in r.kinds})
    return Loaded(Format.RANKS, root, tuple(_references(ranks)), tuple(_warnings(ranks, skipped, replicated)),
                  (source,), metadata={"ranks": {
                      "layout": "verl" if found.verl else "per-rank files", "kind": ", ".join(kinds),
                      "world_size": world, "mesh": list(shown_mesh) if shown_mesh else None,
                      "files": [r.name for r in ranks], "placements": placements, "not_read": skipped,
                  }}, weights_only=wo_input.WeightsOnlyInput(wo_input.SHARDED, path=folder, parts=tuple(
                      (r.name, r.loaded.weights_only) for r in ranks)))


def _check_global_shards(key: str, ranks: list[_Rank], blocks: tuple[Block, ...], folder: str) -> None:
    """A ShardedTensor lists every shard of the world: each must be one the ranks hold."""
    value = ranks[0].raw.get(key)
    if is_distributed(value) != "ShardedTensor":
        return
    held = {(b.offsets, b.sizes) for b in blocks}
    listed = {(o, s) for o, s in global_shards(value) if 0 not in s}
    if listed != held:
        raise InputError(f"the ShardedTensor {key!r} lists shards {sorted(listed)} in its metadata, but the ranks hold "
                         f"{sorted(held)}", folder)


def _rebuild(root: Any, metas: dict[str, TensorMeta], prefix: str = "") -> Any:
    """Rank 0's container with every tensor replaced by its consolidated TensorMeta."""
    out: OrderedDict[str, Any] = OrderedDict()
    for k, v in root.items():
        key = f"{prefix}{k}"
        if key in metas:
            out[k] = metas[key]
        elif isinstance(v, Mapping) and v and all(isinstance(x, str) for x in v):
            out[k] = _rebuild(v, metas, key + ".")
        else:
            out[k] = v
    return out


def _references(ranks: list[_Rank]) -> list[GlobalRef]:
    seen: dict[str, GlobalRef] = {}
    for r in ranks:
        for ref in r.loaded.references:
            seen.setdefault(ref.qualname, GlobalRef(ref.module, ref.name, ref.severity, f"{r.name}/{ref.where}"))
    return list(seen.values())


def _warnings(ranks: list[_Rank], skipped: list[str], replicated: list[str]) -> list[str]:
    out = [f"{r.name}: {w}" for r in ranks for w in r.loaded.warnings]
    if skipped:
        out.append(f"not read (not a rank's model state): {', '.join(skipped[:_SHOWN])}"
                   + (f" and {len(skipped) - _SHOWN} more" if len(skipped) > _SHOWN else ""))
    if replicated:
        out.append(f"{len(replicated)} tensor(s) have pieces several ranks hold ({_keys_shown(set(replicated))}): "
                   "each piece is read once; the copies are compared when the data is read")
    return out


READER = FormatReader(Format.RANKS, read_ranks)
