"""Whether the ranks' blocks of a tensor cover it exactly once; copies of one block are replicas.

A block held by several ranks (a ``Replicate()`` mesh dimension, a plain
tensor every rank saved) is read once, from the lowest rank; the others
are compared with it when its bytes are read (source.py). The distinct
blocks must lie inside the global shape, must not overlap, and must cover
every element: a gap or an overlap is an error, never a guess.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import InputError
from .placement import Block


@dataclass(frozen=True)
class Tiled:
    """The blocks a tensor is read from, and the copies checked against them."""

    blocks: tuple[Block, ...]  # distinct, non-empty, in offset order
    replicas: tuple[tuple[Block, Block], ...]  # (a copy, the block it must equal)


def _box(b: Block) -> str:
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(b.offsets, b.sizes, strict=True)) + "]"


def tile(key: str, shape: tuple[int, ...], blocks: list[Block], path: str) -> Tiled:
    """Check that ``blocks`` tile ``shape``; raise InputError naming the gap or overlap."""
    first: dict[tuple[tuple[int, ...], tuple[int, ...]], Block] = {}
    replicas = []
    for b in sorted(blocks, key=lambda b: b.rank):
        if b.numel == 0:
            continue
        if any(o + s > d for o, s, d in zip(b.offsets, b.sizes, shape, strict=True)):
            raise InputError(f"rank {b.rank}'s shard {_box(b)} of {key!r} lies outside its global shape "
                             f"{list(shape)}", path)
        found = first.get((b.offsets, b.sizes))
        if found is None:
            first[(b.offsets, b.sizes)] = b
        else:
            replicas.append((b, found))
    distinct = sorted(first.values(), key=lambda b: b.offsets)
    for i, a in enumerate(distinct):  # sorted by offset: a box can only overlap those starting before its end
        for b in distinct[i + 1:]:
            if shape and b.offsets[0] >= a.offsets[0] + a.sizes[0]:
                break
            if all(bo < ao + asz and ao < bo + bs
                   for ao, asz, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)):
                raise InputError(f"the shards of {key!r} overlap: rank {a.rank}'s {_box(a)} and rank {b.rank}'s "
                                 f"{_box(b)} (they do not tile its global shape {list(shape)})", path)
    total = 1
    for d in shape:
        total *= d
    covered = sum(b.numel for b in distinct)
    if covered != total:
        raise InputError(f"the shards of {key!r} cover {covered} of the {total} elements of its global shape "
                         f"{list(shape)} (ranks {', '.join(str(r) for r in sorted({b.rank for b in blocks}))}): "
                         "they do not tile it; is a rank's file from another save?", path)
    return Tiled(tuple(distinct), tuple(replicas))
