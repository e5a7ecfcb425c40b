"""Tensor-parallel shards merged into whole tensors, as byte ranges (no tensor assembled in memory).

A tensor split along dim ``d`` over ``tp`` ranks is, in C order, a run of
``prod(shape[:d])`` blocks, each the ranks' rows of that block one after
another: so the merged tensor is a list of segments of the ranks' own byte
ranges (``tp`` of them for dim 0, ``tp x prod(shape[:d])`` otherwise), and a
SegmentSource reads it straight from the files. A padded vocabulary is the
first rows of the merge; DeepSpeed's "two sub-parameters" case is each
rank's two halves taken in turn. AutoTP's affine map says where each block
of a rank's shard lies in the whole tensor (offsets and strides on both
sides): its dense runs become the segments, checked to cover the tensor
exactly once; fused sub-parameters (q, k, v with their recorded widths) are
turned into such a map. A replicated tensor (or block) is read from its
first holder and compared with every other holder's copy each time it is
read (migrate and its verification), so inspect still reads no tensor byte.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import product
from math import prod

from ... import dtypes
from ...errors import InputError
from ...format_names import TpMerge
from ...io import Segment, SegmentSource
from ...model import DataSource, StorageRef, TensorMeta, contiguous_strides
from .tprules import AffineMap, AffinePiece, SubParams, TpRule, TpRules


class ReplicatedSource(DataSource):
    """Tensors (or blocks of them) more than one tensor-parallel rank holds: the first holder's bytes, checked
    against every other holder's copy each time they are read."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._first: dict[str, list[Segment]] = {}
        self._copies: dict[str, list[tuple[int, int, int, list[Segment]]]] = {}  # (offset, rank, first, segs)

    def add(self, key: str, copies: list[list[Segment]]) -> None:
        """Whole copies, rank by rank: rank 0's is read."""
        self.add_blocks(key, copies[0], [(0, r, 0, segs) for r, segs in enumerate(copies[1:], 1)])

    def add_blocks(self, key: str, first: list[Segment], copies: list[tuple[int, int, int, list[Segment]]]) -> None:
        """``first`` read; each copy ``(offset, rank, first holder, segments)`` compared with its bytes there."""
        self._first[key] = first
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
        first = self._read(self._first[key], offset, length)
        for start, rank, holder, segs in self._copies[key]:
            size = sum(s.length for s in segs)
            lo, hi = max(offset, start), min(offset + length, start + size)
            if lo < hi and self._read(segs, lo - start, hi - lo) != first[lo - offset:hi - offset]:
                raise InputError(f"the replicated tensor {key!r} differs between tensor-parallel ranks {holder} and "
                                 f"{rank}: the rules call it replicated, but the ranks hold different values (a wrong "
                                 "rule, or ranks that drifted apart)", self.path)
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


def _runs(piece: AffinePiece) -> Iterator[tuple[int, int, int]]:
    """The piece as (whole-tensor offset, shard offset, length) runs, in elements: its trailing dimensions that
    are dense on both sides make one run, so a row- or column-split block is one run per row at most."""
    shape, (src, src_strides), (dst, dst_strides) = piece.shape, piece.source, piece.dest
    if any(d == 0 for d in shape):
        return
    k, run = len(shape), 1
    while k and (shape[k - 1] == 1 or (src_strides[k - 1] == run and dst_strides[k - 1] == run)):
        run *= shape[k - 1]
        k -= 1
    for index in product(*(range(d) for d in shape[:k])):
        yield (src + sum(i * st for i, st in zip(index, src_strides, strict=False)),
               dst + sum(i * st for i, st in zip(index, dst_strides, strict=False)), run)


def _affine(key: str, metas: Sequence[TensorMeta], amap: AffineMap, path: str
            ) -> tuple[tuple[int, ...], list[Segment], list[tuple[int, int, int, list[Segment]]]]:
    """The tensor as its affine map places the ranks' pieces: its segments, and the other holders' copies of
    every replicated block (offset, rank, first holder, segments) to check them against."""
    where = f"the affine_map for {key!r} ('{amap.pattern}')"
    if len(amap.ranks) != len(metas):
        raise InputError(f"{where} describes {len(amap.ranks)} tensor-parallel rank(s), but the run has "
                         f"{len(metas)}", path)
    itemsize = dtypes.lookup(metas[0].dtype).itemsize
    numel = prod(amap.logical_shape)
    per_rank = []
    for r, (m, (shard, _)) in enumerate(zip(metas, amap.ranks, strict=True)):
        if m.numel != prod(shard):
            raise InputError(f"{key!r} is {list(m.shape)} on tensor-parallel rank {r}, but {where} gives that rank "
                             f"a shard of {list(shard)}", path)
        per_rank.append(byte_segments(m))
    runs: list[tuple[int, int, int, int]] = []
    copies: list[tuple[int, int, int, list[Segment]]] = []
    for r, (shard, pieces) in enumerate(amap.ranks):
        held = prod(shard)
        for piece in pieces:
            if piece.scale != 1.0:
                raise InputError(f"cannot merge the tensor-parallel shards of {key!r}: rank {r} holds a block of it "
                                 f"scaled by {piece.scale:g} ({where}); ckpt copies bytes and does not compute, so "
                                 "it cannot undo the scaling", path)
            first = piece.locations[0]
            for full, dest, length in _runs(piece):
                if full < 0 or full + length > numel or dest < 0 or dest + length > held:
                    raise InputError(f"{where} places a piece of rank {r} outside the tensor {list(amap.logical_shape)}"
                                     f" or outside the rank's shard {list(shard)}", path)
                if r == first:
                    runs.append((full, r, dest, length))
                else:
                    copies.append((full * itemsize, r, first,
                                   _cut(per_rank[r], dest * itemsize, length * itemsize)))
    runs.sort()
    segs: list[Segment] = []
    cursor = 0
    for full, r, dest, length in runs:
        if full != cursor:
            what = f"leaves elements {cursor}..{full - 1}" if full > cursor else f"places two pieces at element {full}"
            raise InputError(f"{where} {what} of {list(amap.logical_shape)}: it does not describe the whole tensor "
                             "exactly once", path)
        segs += _cut(per_rank[r], dest * itemsize, length * itemsize)
        cursor += length
    if cursor != numel:
        raise InputError(f"{where} leaves elements {cursor}..{numel - 1} of {list(amap.logical_shape)}: it does not "
                         "describe the whole tensor exactly once", path)
    return amap.logical_shape, _cut(segs, 0, numel * itemsize), copies


def _sub_param_map(key: str, metas: Sequence[TensorMeta], sub: SubParams | None, path: str) -> AffineMap:
    """The affine map a ``parameter_with_sub_params`` record implies for these shards (ds_to_universal's merge:
    rank r holds ``widths[i][r]`` of each sub-parameter i in turn along the partition dimension)."""
    shape0, tp = metas[0].shape, len(metas)
    if sub is None or sub.ndim != len(shape0) or sub.dim >= len(shape0):
        raise InputError(f"cannot merge the tensor-parallel shards of {key!r}: its sub-parameter record views it "
                         f"with another shape than its {len(shape0)}-d shards, which ckpt does not merge", path)
    d = sub.dim
    if any(len(m.shape) != len(shape0) or any(a != b for i, (a, b) in enumerate(zip(m.shape, shape0, strict=True))
                                              if i != d) for m in metas):
        raise InputError(f"{key!r}'s shards ({', '.join(str(list(m.shape)) for m in metas)}) do not stack along "
                         f"dim {d}, its sub-parameters' partition dimension", path)
    widths = sub.widths
    if widths is None:  # recorded before sub_param_shard_widths: the split was even (or it cannot be rebuilt)
        total = sum(m.shape[d] for m in metas)
        sizes = sub.sizes or ((total // sub.count,) * sub.count if sub.count and total % sub.count == 0 else ())
        if not sizes or any(size % tp for size in sizes):
            raise InputError(f"cannot merge the tensor-parallel shards of {key!r}: its sub-parameters "
                             f"({list(sizes) or sub.count}) do not split evenly over {tp} ranks and the run records "
                             "no sub_param_shard_widths", path)
        widths = tuple((size // tp,) * tp for size in sizes)
    for r, m in enumerate(metas):
        if any(len(w) != tp for w in widths) or sum(w[r] for w in widths) != m.shape[d]:
            raise InputError(f"{key!r} holds {m.shape[d]} along dim {d} on tensor-parallel rank {r}, but its "
                             f"sub_param_shard_widths {[list(w) for w in widths]} say otherwise", path)
    full = (*shape0[:d], sum(sum(w) for w in widths), *shape0[d + 1:])
    fs = contiguous_strides(full)
    ranks = []
    for r, m in enumerate(metas):
        ss = contiguous_strides(m.shape)
        pieces, start, local = [], 0, 0
        for w in widths:
            block = (*m.shape[:d], w[r], *m.shape[d + 1:])
            pieces.append(AffinePiece(block, ((start + sum(w[:r])) * fs[d], fs), (local * ss[d], ss), (r,)))
            start, local = start + sum(w), local + w[r]
        ranks.append((m.shape, tuple(pieces)))
    return AffineMap(sub.pattern, full, tuple(ranks))


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
    for key in ranks[0]:
        metas = _rank_metas(key, ranks, folder)
        amap = rules.affine_for(key, folder)  # the map places every piece; no category is consulted (ds_to_universal)
        rule: TpRule | None = None if amap is not None else rules.rule_for(key)
        if amap is None and rule is None:
            unmatched.append(key)
            continue
        if rule is not None and rule.merge is TpMerge.REPLICATED:
            out[key], name = _replicate(key, metas, rule, replicated, folder), "replicated"
        else:
            out[key], name = _split_merge(key, metas, amap, rule, rules, (merged, replicated), folder)
        counts[name] = counts.get(name, 0) + 1
    if unmatched:
        pp, tp = pp_tp
        shown = ", ".join(repr(k) for k in unmatched[:5]) + (f" and {len(unmatched) - 5} more"
                                                             if len(unmatched) > 5 else "")
        raise InputError(f"the tensor-parallel rules ({rules.origin}) say nothing about {shown} (pp={pp}, tp={tp}): "
                         "add a [[tp]] table or a 'replicated' pattern for each", folder)
    return out, [merged, replicated], counts


def _rank_metas(key: str, ranks: Sequence[OrderedDict[str, TensorMeta]], folder: str) -> list[TensorMeta]:
    """``key`` on every rank, in rank order: each must hold it, in rank 0's dtype."""
    meta0 = ranks[0][key]
    metas = []
    for r, rank in enumerate(ranks):
        if key not in rank:
            raise InputError(f"{key!r} is missing on tensor-parallel rank {r}", folder)
        if rank[key].dtype != meta0.dtype:
            raise InputError(f"{key!r} is {rank[key].dtype} on tensor-parallel rank {r} but {meta0.dtype} on "
                             "rank 0", folder)
        metas.append(rank[key])
    return metas


def _replicate(key: str, metas: list[TensorMeta], rule: TpRule, replicated: ReplicatedSource, folder: str
               ) -> TensorMeta:
    """A tensor every rank holds whole: read from the first, compared with the others when read."""
    meta0 = metas[0]
    itemsize = dtypes.lookup(meta0.dtype).itemsize
    if any(m.shape != meta0.shape for m in metas):
        raise InputError(f"{key!r} is replicated by the rules ({rule.pattern!r}) but its shape differs "
                         f"between ranks ({', '.join(str(list(m.shape)) for m in metas)})", folder)
    replicated.add(key, [byte_segments(m) for m in metas])
    return TensorMeta(key, meta0.dtype, meta0.shape, contiguous_strides(meta0.shape), 0,
                      StorageRef(replicated, key, meta0.numel * itemsize))


def _split_merge(key: str, metas: list[TensorMeta], amap: AffineMap | None, rule: TpRule | None, rules: TpRules,
                 into: tuple[SegmentSource, ReplicatedSource], folder: str) -> tuple[TensorMeta, str]:
    """A tensor split over the ranks, merged by its affine map or rule; the merge's name (for the counts)."""
    merged, replicated = into
    if rule is not None:
        why = rules.unsupported_for(key)
        if why is not None:
            raise InputError(f"cannot merge the tensor-parallel shards of {key!r}: {why}", folder)
    meta0 = metas[0]
    itemsize = dtypes.lookup(meta0.dtype).itemsize
    copies: list[tuple[int, int, int, list[Segment]]] = []
    if rule is None or rule.merge is TpMerge.SUB_PARAMS:
        if amap is None:
            amap = _sub_param_map(key, metas, rules.sub_params_for(rule.pattern) if rule else None, folder)
        shape, segs, copies = _affine(key, metas, amap, folder)
        name = str(TpMerge.AFFINE if rule is None else TpMerge.SUB_PARAMS)
    elif rule.merge is TpMerge.TWO_SUB_PARAMS:
        shape, segs = _two_halves(key, metas, folder)
        name = str(rule.merge)
    else:
        shape, segs = _concat(key, metas, rule.dim, folder)
        name = "concatenated along dim " + str(rule.dim)
    rows = rules.vocab_rows(key)  # after every merge, the affine map's too (as ds_to_universal)
    if rows is not None and rows != shape[0]:
        if rows > shape[0]:
            raise InputError(f"the vocabulary size {rows} is larger than {key!r}'s {shape[0]} merged rows", folder)
        shape = (rows, *shape[1:])
        segs = _cut(segs, 0, prod(shape) * itemsize)
    if copies:
        replicated.add_blocks(key, segs, copies)
        ref = StorageRef(replicated, key, prod(shape) * itemsize)
    else:
        ref = StorageRef(merged, key, merged.add(key, segs))
    return TensorMeta(key, meta0.dtype, shape, contiguous_strides(shape), 0, ref), name
