"""Tensor-parallel shards merged into whole tensors, as byte ranges (no tensor assembled in memory).

A tensor split along dim ``d`` over ``tp`` ranks is, in C order, a run of
``prod(shape[:d])`` blocks, each the ranks' rows of that block one after
another: so the merged tensor is a list of segments of the ranks' own byte
ranges (``tp`` of them for dim 0, ``tp x prod(shape[:d])`` otherwise), and a
SegmentSource reads it straight from the files. A padded vocabulary is the
first rows of the merge; DeepSpeed's "two sub-parameters" case is each
rank's two halves taken in turn. A replicated tensor is read from rank 0 and
compared with every other rank's copy each time it is read (migrate and its
verification), so inspect still reads no tensor byte.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from math import prod

from ... import dtypes
from ...errors import InputError
from ...format_names import TpMerge
from ...io.segments import Segment, SegmentSource
from ...model import DataSource, StorageRef, TensorMeta, contiguous_strides
from .tprules import TpRule, TpRules


class ReplicatedSource(DataSource):
    """Tensors every tensor-parallel rank holds whole: rank 0's bytes, checked against the other ranks'."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._copies: dict[str, list[list[Segment]]] = {}

    def add(self, key: str, copies: list[list[Segment]]) -> None:
        self._copies[key] = copies

    @staticmethod
    def _read(segs: list[Segment], offset: int, length: int) -> bytes:
        out = bytearray()
        pos = 0
        for seg in segs:
            lo, hi = max(offset, pos), min(offset + length, pos + seg.length)
            if lo < hi:
                out += seg.source.read(seg.key, seg.offset + lo - pos, hi - lo)
            pos += seg.length
        return bytes(out)

    def read(self, key: str, offset: int, length: int) -> bytes:
        copies = self._copies[key]
        first = self._read(copies[0], offset, length)
        for rank, segs in enumerate(copies[1:], 1):
            if self._read(segs, offset, length) != first:
                raise InputError(f"the replicated tensor {key!r} differs between tensor-parallel ranks 0 and {rank}: "
                                 "the rules call it replicated, but the ranks hold different values (a wrong rule, or "
                                 "ranks that drifted apart)", self.path)
        return first


def byte_segments(meta: TensorMeta) -> list[Segment]:
    """The tensor's bytes in C order as segments of plain storages (a SegmentSource's flattened)."""
    ref = meta.storage
    if ref is None or not meta.is_contiguous:
        raise InputError(f"tensor {meta.key!r} is not a contiguous tensor with data; its shards cannot be merged",
                         getattr(ref.source, "path", "") if ref else "")
    itemsize = dtypes.lookup(meta.dtype).itemsize
    start, length = meta.storage_offset * itemsize, meta.numel * itemsize
    source = ref.source
    if isinstance(source, SegmentSource):
        return list(source.pieces(ref.key, start, length))
    return [Segment(source, ref.key, start, length)] if length else []


def _cut(segs: Sequence[Segment], offset: int, length: int) -> list[Segment]:
    out: list[Segment] = []
    pos = 0
    for seg in segs:
        lo, hi = max(offset, pos), min(offset + length, pos + seg.length)
        if lo < hi:
            s = Segment(seg.source, seg.key, seg.offset + lo - pos, hi - lo)
            if out and out[-1].source is s.source and out[-1].key == s.key \
                    and out[-1].offset + out[-1].length == s.offset:
                prev = out.pop()
                s = Segment(prev.source, prev.key, prev.offset, prev.length + s.length)
            out.append(s)
        pos += seg.length
    return out


def _concat(key: str, metas: Sequence[TensorMeta], dim: int, path: str) -> tuple[tuple[int, ...], list[Segment]]:
    shape0 = metas[0].shape
    if dim >= len(shape0):
        raise InputError(f"the rule for {key!r} splits dim {dim}, but the tensor has {len(shape0)} dimension(s) "
                         f"{list(shape0)}", path)
    for r, m in enumerate(metas):
        if len(m.shape) != len(shape0) or any(a != b for i, (a, b) in enumerate(zip(m.shape, shape0, strict=True))
                                              if i != dim):
            raise InputError(f"{key!r} is {list(m.shape)} on tensor-parallel rank {r} but {list(shape0)} on rank 0: "
                             f"the shards do not concatenate along dim {dim}", path)
    itemsize = dtypes.lookup(metas[0].dtype).itemsize
    shape = (*shape0[:dim], sum(m.shape[dim] for m in metas), *shape0[dim + 1:])
    outer = prod(shape0[:dim])
    per_rank = [byte_segments(m) for m in metas]
    inner = [prod(m.shape[dim:]) * itemsize for m in metas]
    segs: list[Segment] = []
    for o in range(outer):
        for r, rs in enumerate(per_rank):
            segs += _cut(rs, o * inner[r], inner[r])
    return shape, _cut(segs, 0, sum(s.length for s in segs))


def _two_halves(key: str, metas: Sequence[TensorMeta], path: str) -> tuple[tuple[int, ...], list[Segment]]:
    shape0 = metas[0].shape
    if not shape0 or any(m.shape != shape0 for m in metas) or shape0[0] % 2:
        raise InputError(f"{key!r} is a two-sub-parameter tensor but its shards are not the same even-rowed shape",
                         path)
    itemsize = dtypes.lookup(metas[0].dtype).itemsize
    half = prod(shape0) * itemsize // 2
    per_rank = [byte_segments(m) for m in metas]
    segs = [s for h in (0, 1) for rs in per_rank for s in _cut(rs, h * half, half)]
    return (shape0[0] * len(metas), *shape0[1:]), segs


def merge_ranks(ranks: Sequence[OrderedDict[str, TensorMeta]], rules: TpRules, folder: str,
                pp_tp: tuple[int, int]) -> tuple[OrderedDict[str, TensorMeta], list[DataSource], dict[str, int]]:
    """The tensors of every tensor-parallel rank merged into one model, in rank 0's order.

    Returns the tensors, the sources that read them and how many tensors each merge kind took.
    """
    merged = SegmentSource(folder)
    replicated = ReplicatedSource(folder)
    out: OrderedDict[str, TensorMeta] = OrderedDict()
    counts: dict[str, int] = {}
    extra = sorted({k for r in ranks[1:] for k in r} - set(ranks[0]))
    if extra:
        raise InputError(f"tensor-parallel rank(s) hold {', '.join(map(repr, extra[:3]))}, which rank 0 does not",
                         folder)
    unmatched = []
    for key, meta0 in ranks[0].items():
        metas = []
        for r, rank in enumerate(ranks):
            if key not in rank:
                raise InputError(f"{key!r} is missing on tensor-parallel rank {r}", folder)
            if rank[key].dtype != meta0.dtype:
                raise InputError(f"{key!r} is {rank[key].dtype} on tensor-parallel rank {r} but {meta0.dtype} on "
                                 "rank 0", folder)
            metas.append(rank[key])
        rule: TpRule | None = rules.rule_for(key)
        if rule is None:
            unmatched.append(key)
            continue
        if rule.merge is not TpMerge.REPLICATED:
            why = rules.unsupported_for(key)
            if why is not None:
                raise InputError(f"cannot merge the tensor-parallel shards of {key!r}: {why}", folder)
        itemsize = dtypes.lookup(meta0.dtype).itemsize
        if rule.merge is TpMerge.REPLICATED:
            if any(m.shape != meta0.shape for m in metas):
                raise InputError(f"{key!r} is replicated by the rules ({rule.pattern!r}) but its shape differs "
                                 f"between ranks ({', '.join(str(list(m.shape)) for m in metas)})", folder)
            replicated.add(key, [byte_segments(m) for m in metas])
            out[key] = TensorMeta(key, meta0.dtype, meta0.shape, contiguous_strides(meta0.shape), 0,
                                  StorageRef(replicated, key, meta0.numel * itemsize))
            counts["replicated"] = counts.get("replicated", 0) + 1
            continue
        if rule.merge is TpMerge.TWO_SUB_PARAMS:
            shape, segs = _two_halves(key, metas, folder)
        else:
            shape, segs = _concat(key, metas, rule.dim, folder)
        rows = rules.vocab_rows(key)
        if rows is not None:
            if rows > shape[0]:
                raise InputError(f"the vocabulary size {rows} is larger than {key!r}'s {shape[0]} merged rows",
                                 folder)
            shape = (rows, *shape[1:])
            segs = _cut(segs, 0, prod(shape) * itemsize)
        nbytes = merged.add(key, segs)
        out[key] = TensorMeta(key, meta0.dtype, shape, contiguous_strides(shape), 0, StorageRef(merged, key, nbytes))
        name = "concatenated along dim " + str(rule.dim) if rule.merge is TpMerge.CONCAT else str(rule.merge)
        counts[name] = counts.get(name, 0) + 1
    if unmatched:
        pp, tp = pp_tp
        shown = ", ".join(repr(k) for k in unmatched[:5]) + (f" and {len(unmatched) - 5} more"
                                                             if len(unmatched) > 5 else "")
        raise InputError(f"the tensor-parallel rules ({rules.origin}) say nothing about {shown} (pp={pp}, tp={tp}): "
                         "add a [[tp]] table or a 'replicated' pattern for each", folder)
    return out, [merged, replicated], counts
