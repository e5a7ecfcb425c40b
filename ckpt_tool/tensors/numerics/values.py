"""How far A's tensor values are from B's, pair by pair (``ckpt diff --values``).

The only part of diff that reads tensor bytes. Pairs are streamed chunk by
chunk: identical, finite pairs cost a memcmp and a bit test, differing
float16/32/64 pairs NumPy's arithmetic, and only the rest (NaN/Inf, other
dtypes) torch (closeness.py), imported in the background while the fast
paths run.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any

from ...model import TensorMeta
from ...progress import NO_PROGRESS, Progress
from .bitwise import compared_numel
from .closeness import CHUNK, Acc, ValueDiff, compare_dtype, compare_pair, compared_as, worst


def compare_values(
    pairs: Sequence[tuple[TensorMeta, TensorMeta]], *, atol: float, rtol: float,
    progress: Progress = NO_PROGRESS, norms: bool = False, histograms: int = 0,
    rank: Callable[[ValueDiff], float] | None = None,
) -> tuple[list[ValueDiff], list[str]]:
    """(one ValueDiff per pair, keys skipped because a side holds no data).

    ``progress`` counts pairs ("comparing values"), skipped ones included.
    ``norms``: read the norms of identical pairs too (rollups need them; it
    costs a pass of arithmetic over data that is otherwise only memcmp'd).
    ``histograms``: bin A, B and B-A of differing pairs while they stream,
    and keep the bins of the ``histograms`` pairs that ``rank`` puts first
    (largest first), so memory stays bounded.

    Each pair is read chunk by chunk (tensordata.iter_chunks) and compared
    as it is read, so peak memory is a few chunks, whatever the tensor sizes
    (a strided view is gathered whole first).
    """
    results: list[ValueDiff | None] = []
    skipped: list[str] = []
    later: list[int] = []  # indices into results: pairs compared value by value, with torch, at the end
    slots: dict[int, tuple[TensorMeta, TensorMeta]] = {}
    started = False  # torch is being imported in the background
    # Pairs of one dtype and shape are first compared where worker threads
    # read them (_quick_diffs): an identical, all-finite pair (most of a
    # near-identical checkpoint) costs a memcmp and a bit test, a differing
    # fp16/32/64 pair NumPy's arithmetic on the same chunks, no torch. The
    # other pairs wait until that pass is done, while torch is imported on
    # another thread (1-2 s here, otherwise added to the total).
    quick = [(ta, tb) for ta, tb in pairs if _bytewise(ta, tb)]
    verdicts = _quick_diffs(quick, atol=atol, rtol=rtol, norms=norms, histograms=bool(histograms))
    kept = _TopHistograms(results, histograms, rank)
    pending = iter(quick)
    next_quick = next(pending, None)
    restore: list[int] = []
    progress.start("comparing values", len(pairs))
    try:
        for ta, tb in pairs:
            if ta.storage is None or tb.storage is None:
                skipped.append(ta.key)
                progress.advance(1)
                continue
            if next_quick is not None and next_quick[0] is ta and next_quick[1] is tb:
                next_quick = next(pending, None)
                found = next(verdicts)
                if found is not None and not found.same and (not found.norms or (histograms and not found.hist_a)):
                    found = None  # differs, but identical chunks' norms or bins were skipped: read it again
                if found is not None:
                    results.append(found)
                    kept.offer(len(results) - 1)
                    progress.advance(1)
                    continue
            if not started and not _numpy_comparable(ta, tb):
                started = True
                _import_torch_in_background()
            later.append(len(results))
            results.append(None)
            slots[len(results) - 1] = (ta, tb)
        for i in later:
            ta, tb = slots[i]
            quick_diff = (_numpy_pair(ta, tb, atol=atol, rtol=rtol, norms=True, histograms=bool(histograms),
                                      bin_identical=True) if _numpy_comparable(ta, tb) else None)
            results[i] = quick_diff or compare_pair(ta, tb, atol=atol, rtol=rtol, histograms=bool(histograms),
                                                    _threads=restore)
            kept.offer(i)
            progress.advance(1)
    finally:
        progress.done()
        verdicts.close()
        if restore:
            import torch

            torch.set_num_threads(restore[0])
    return [r for r in results if r is not None], skipped


class _TopHistograms:
    """Keeps the histograms of the ``count`` results ``rank`` puts first; the others' are dropped as they come."""

    def __init__(self, results: list[ValueDiff | None], count: int, rank: Callable[[ValueDiff], float] | None) -> None:
        self.results, self.count = results, count
        self.rank = rank or (lambda v: v.max_abs)
        self.heap: list[tuple[float, int]] = []  # (rank, index in results): a min-heap of those holding bins

    def offer(self, i: int) -> None:
        import heapq

        v = self.results[i]
        if v is None or not v.hist_a:
            return
        if v.same:  # nothing changed: bins that say so are not worth a place among the top
            self.results[i] = replace(v, hist_a=(), hist_b=(), hist_diff=())
            return
        score = self.rank(v)
        heapq.heappush(self.heap, (math.inf if score != score else score, i))
        if len(self.heap) > self.count:
            _, worst_i = heapq.heappop(self.heap)
            dropped = self.results[worst_i]
            if dropped is not None:
                self.results[worst_i] = replace(dropped, hist_a=(), hist_b=(), hist_diff=())


_NUMPY_FLOATS = {"float16": "<f2", "float32": "<f4", "float64": "<f8"}


def _numpy_comparable(ta: TensorMeta, tb: TensorMeta) -> bool:
    """Both sides are floats NumPy holds natively, stored contiguously: _numpy_pair can try them."""
    return (ta.dtype in _NUMPY_FLOATS and tb.dtype in _NUMPY_FLOATS and ta.numel == tb.numel
            and ta.is_contiguous and tb.is_contiguous)


class _NumpyCompare:
    """compare_pair's finite path for float16/32/64 chunks, in NumPy (no torch import).

    The same operations in the same dtype (_compare_dtype) as compare_pair,
    so the figures are identical. ``chunk`` returns None for a chunk that
    holds a NaN or Inf (or whose difference overflows): compare_pair then
    handles the pair, with its equal_nan and Inf rules. ``norms``: also sum
    the squares of identical chunks (a rollup needs every tensor's norm).
    """

    def __init__(self, ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float, norms: bool = False,
                 histograms: bool = False, bin_identical: bool = False) -> None:
        import numpy as np

        self.key, self.numel = ta.key, ta.numel
        self.cd = compare_dtype(ta.dtype, tb.dtype)
        self.ct = np.dtype(_NUMPY_FLOATS[self.cd])
        self.fa, self.fb = np.dtype(_NUMPY_FLOATS[ta.dtype]), np.dtype(_NUMPY_FLOATS[tb.dtype])
        self.same_dtype = ta.dtype == tb.dtype
        self.dtype = ta.dtype
        self.atol, self.rtol = self.ct.type(atol), self.ct.type(rtol)
        self.norms, self.histograms = norms, histograms
        # binning every identical chunk would cost more than the whole comparison; only a pair read again
        # because it differs elsewhere (compare_values) bins them
        self.bin_identical = bin_identical
        self.acc = Acc(norms=True, histograms=histograms)

    def chunk(self, ra: Any, rb: Any) -> Acc | None:
        """One chunk of each side (the same elements) compared on its own; None: NaN/Inf, leave it to torch.

        Thread-safe (it changes nothing): chunks of one pair may be compared
        on several threads and their results merged in order (``merge``).
        """
        import numpy as np

        from ..data import all_finite, same_bytes

        acc = Acc(histograms=self.histograms)
        fa, fb, ct = self.fa, self.fb, self.ct
        if self.same_dtype and same_bytes(ra, rb):
            if all_finite(ra, self.dtype) is False:
                return None
            if self.norms:
                binned = self.histograms and self.bin_identical
                acc.sq_a = acc.sq_b = acc.dot = _square_sum(np.frombuffer(ra, dtype=fa), acc if binned else None)
                acc.unbinned = int(self.histograms and not binned)
            else:
                acc.norms = False
            return acc
        n = len(ra) // fa.itemsize
        # float64 buffers for the sums, reused by every piece (a fresh array per piece costs its page faults)
        bufs = np.empty((3, min(CHUNK, n)), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for first in range(0, n, CHUNK):  # pieces that stay in the CPU cache
                count = min(CHUNK, n - first)
                xa = np.frombuffer(ra, dtype=fa, count=count, offset=first * fa.itemsize).astype(ct)
                yb = np.frombuffer(rb, dtype=fb, count=count, offset=first * fb.itemsize).astype(ct)
                a64, b64, scratch = bufs[0, :count], bufs[1, :count], bufs[2, :count]
                np.copyto(a64, xa)  # the sums' copies, before xa is reused
                np.copyto(b64, yb)
                ad = np.abs(np.subtract(xa, yb, out=xa), out=xa)
                top = float(ad.max())
                if not math.isfinite(top):
                    return None
                acc.max_abs = worst(acc.max_abs, top)
                ref = np.abs(yb, out=yb)
                bound = np.multiply(ref, self.rtol)
                bound += self.atol
                acc.bad += int(np.count_nonzero(ad > bound))
                # max |a-b|/|b|: 0/0 (NaN) counts as equal, x/0 as inf; fmax skips NaNs
                rel = float(np.fmax.reduce(np.divide(ad, ref, out=bound)))
                if rel == rel:
                    acc.max_rel = worst(acc.max_rel, rel)
                acc.sq_a += _dot(a64, a64, scratch)
                acc.sq_b += _dot(b64, b64, scratch)
                acc.dot += _dot(a64, b64, scratch)
                if self.histograms:
                    acc.add_histograms(a64, b64)
                d = np.subtract(b64, a64, out=b64)
                acc.sq_diff += _dot(d, d, scratch)
                acc.sum_abs += float(np.add.reduce(np.abs(d, out=d)))
        return acc

    def merge(self, part: Acc) -> None:
        self.acc.merge(part)

    def result(self) -> ValueDiff:
        return self.acc.result(self.key, self.numel, self.cd)


def _dot(x: Any, y: Any, scratch: Any = None) -> float:
    """sum(x * y) of float64 arrays without BLAS: np.dot hands each call to OpenBLAS's thread pool, whose
    spinning workers made the comparison 20x slower on a busy 2-core machine (measured: 4.3 ms against
    0.4 ms per 262,144 elements, called from the reader threads); add.reduce also sums pairwise."""
    import numpy as np

    return float(np.add.reduce(np.multiply(x, y, out=scratch)))


def _square_sum(values: Any, acc: Acc | None) -> float:
    """sum(x**2) in float64 of an identical chunk, converted piece by piece into one reused buffer (NumPy's
    float16 cast is the cost here: 2.5x faster than one astype of the whole chunk); ``acc``: bin it too."""
    import numpy as np

    total = 0.0
    buf = np.empty(min(CHUNK, values.size), dtype=np.float64)
    for first in range(0, values.size, CHUNK):
        piece = buf[: min(CHUNK, values.size - first)]
        np.copyto(piece, values[first:first + piece.size])
        if acc is not None:
            acc.add_histograms(piece, piece)
        total += float(np.add.reduce(np.multiply(piece, piece, out=piece)))
    return total


def _numpy_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float, norms: bool = False,
                histograms: bool = False, bin_identical: bool = False) -> ValueDiff | None:
    """compare_pair's result for finite float16/32/64 values (_NumpyCompare), reading the pair here."""
    from ..data import iter_raw

    compare = _NumpyCompare(ta, tb, atol=atol, rtol=rtol, norms=norms, histograms=histograms,
                            bin_identical=bin_identical)
    for ra, rb in zip(iter_raw(ta, CHUNK * compare.fa.itemsize), iter_raw(tb, CHUNK * compare.fb.itemsize),
                      strict=False):
        part = compare.chunk(ra, rb)
        if part is None:
            return None
        compare.merge(part)
    return compare.result()


def _import_torch_in_background() -> None:
    """Start importing torch on a daemon thread; ``import torch`` later waits for it to finish.

    Overlaps torch's 1-2 s import with the NumPy pass over the pairs that need no torch.
    """
    import sys
    import threading

    if "torch" not in sys.modules:
        threading.Thread(target=__import__, args=("torch",), name="ckpt-import-torch", daemon=True).start()


def _bytewise(ta: TensorMeta, tb: TensorMeta) -> bool:
    # quantized: the same integers under another scale are other values (closeness.py dequantizes them)
    return (ta.storage is not None and tb.storage is not None and ta.dtype == tb.dtype and ta.shape == tb.shape
            and ta.numel > 0 and ta.is_contiguous and tb.is_contiguous
            and ta.quantizer is None and tb.quantizer is None)


def _quick_diffs(pairs: list[tuple[TensorMeta, TensorMeta]], *, atol: float, rtol: float, norms: bool,
                 histograms: bool) -> Generator[ValueDiff | None, None, None]:
    """Per pair (same dtype and shape, contiguous), in order: its ValueDiff, or None to leave it to the caller.

    Worker threads read both sides chunk by chunk and check each chunk where
    they read it (tensordata.check_reads). A pair whose bytes are identical
    and finite gets a zero ValueDiff; a differing fp16/32/64 pair is
    compared with NumPy on the same chunks (_NumpyCompare), so it is never
    read twice. A pair with NaN/Inf, or of another dtype, that differs gets
    None at its first such chunk (its remaining chunks are passed over).
    """
    from ..data import all_finite, check_reads, group_reads, same_bytes

    # Small pairs (200,000 of them in some files) are read here and bit-tested in
    # batches: a thread hand-off and a NumPy call per pair would cost more than the bytes.
    small = _small_verdicts([p for p in pairs if p[0].nbytes < _SMALL_PAIR])
    large = [(ta, tb) for ta, tb in pairs if ta.nbytes >= _SMALL_PAIR]
    numeric = [_NumpyCompare(ta, tb, atol=atol, rtol=rtol, norms=norms, histograms=histograms)
               if _numpy_comparable(ta, tb) else None for ta, tb in large]
    reads, owner = group_reads(large)
    counts = Counter(owner)  # chunks per large pair
    given_up: set[int] = set()  # large pairs already left to the caller

    def check(i: int, a: Any, b: Any) -> Acc | None:
        compare = numeric[owner[i]]
        if compare is not None:
            return compare.chunk(a, b)
        if norms:  # an identical pair's norm needs its values: compare_pair reads them
            return None
        return Acc() if same_bytes(a, b) and all_finite(a, large[owner[i]][0].dtype) is not False else None

    results = check_reads(reads, check, skip=lambda i: owner[i] in given_up)
    p = 0
    try:
        for ta, tb in pairs:
            if ta.nbytes < _SMALL_PAIR:
                yield _zero_diff(ta, tb) if small[id(ta), id(tb)] and not norms else None
                continue
            compare = numeric[p]
            ok = True
            for _ in range(counts[p]):
                part = next(results)
                if not ok:
                    continue
                if part is None:
                    ok = False
                    given_up.add(p)
                elif compare is not None:
                    compare.merge(part)
            yield (compare.result() if compare is not None else _zero_diff(ta, tb)) if ok else None
            p += 1
    finally:
        results.close()


def _zero_diff(ta: TensorMeta, tb: TensorMeta) -> ValueDiff:
    """The ValueDiff of a pair that holds the same bytes, none of them NaN or Inf."""
    return ValueDiff(ta.key, 0.0, 0.0, 0, 0, 0, 0, True, 0, compared_numel(ta), compared_as(ta.dtype, tb.dtype))


_SMALL_PAIR = 256 << 10  # bytes: pairs of smaller tensors are tested in batches, without the worker threads


def _small_verdicts(pairs: list[tuple[TensorMeta, TensorMeta]]) -> dict[tuple[int, int], bool]:
    """Per (id(a), id(b)) of small pairs: True if the bytes are the same and none is NaN/Inf (tested per batch)."""
    from ..data import RAW_CHUNK, all_finite, tensor_bytes

    out: dict[tuple[int, int], bool] = {}
    pending: dict[str, list[tuple[tuple[int, int], bytes]]] = {}  # dtype -> identical pairs awaiting the bit test
    sizes: dict[str, int] = {}

    def flush(dtype: str) -> None:
        batch = pending.pop(dtype, [])
        sizes.pop(dtype, None)
        if batch and all_finite(b"".join(raw for _, raw in batch), dtype) is not False:
            out.update((key, True) for key, _ in batch)
        else:
            out.update((key, all_finite(raw, dtype) is not False) for key, raw in batch)

    for ta, tb in pairs:
        raw = tensor_bytes(ta)
        key = (id(ta), id(tb))
        if raw != tensor_bytes(tb):
            out[key] = False
            continue
        pending.setdefault(ta.dtype, []).append((key, raw))
        sizes[ta.dtype] = sizes.get(ta.dtype, 0) + len(raw)
        if sizes[ta.dtype] >= RAW_CHUNK:
            flush(ta.dtype)
    for dtype in list(pending):
        flush(dtype)
    return out
