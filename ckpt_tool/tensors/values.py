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
from collections.abc import Generator, Sequence
from typing import Any

from ..model import TensorMeta
from ..progress import NO_PROGRESS, Progress
from .closeness import CHUNK, Acc, ValueDiff, compare_dtype, compare_pair


def compare_values(
    pairs: Sequence[tuple[TensorMeta, TensorMeta]], *, atol: float, rtol: float,
    progress: Progress = NO_PROGRESS,
) -> tuple[list[ValueDiff], list[str]]:
    """(one ValueDiff per pair, keys skipped because a side holds no data).

    ``progress`` counts pairs ("comparing values"), skipped ones included.

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
    verdicts = _quick_diffs(quick, atol=atol, rtol=rtol)
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
                if found is not None:
                    results.append(found)
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
            quick_diff = _numpy_pair(ta, tb, atol=atol, rtol=rtol) if _numpy_comparable(ta, tb) else None
            results[i] = quick_diff or compare_pair(ta, tb, atol=atol, rtol=rtol, _threads=restore)
            progress.advance(1)
    finally:
        progress.done()
        verdicts.close()
        if restore:
            import torch

            torch.set_num_threads(restore[0])
    return [r for r in results if r is not None], skipped


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
    handles the pair, with its equal_nan and Inf rules.
    """

    def __init__(self, ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float) -> None:
        import numpy as np

        self.key, self.numel = ta.key, ta.numel
        self.cd = compare_dtype(ta.dtype, tb.dtype)
        self.ct = np.dtype(_NUMPY_FLOATS[self.cd])
        self.fa, self.fb = np.dtype(_NUMPY_FLOATS[ta.dtype]), np.dtype(_NUMPY_FLOATS[tb.dtype])
        self.same_dtype = ta.dtype == tb.dtype
        self.dtype = ta.dtype
        self.atol, self.rtol = self.ct.type(atol), self.ct.type(rtol)
        self.acc = Acc()

    def chunk(self, ra: Any, rb: Any) -> Acc | None:
        """One chunk of each side (the same elements) compared on its own; None: NaN/Inf, leave it to torch.

        Thread-safe (it changes nothing): chunks of one pair may be compared
        on several threads and their results merged in order (``merge``).
        """
        import numpy as np

        from .tensordata import all_finite, same_bytes

        acc = Acc()
        if self.same_dtype and same_bytes(ra, rb):
            return acc if all_finite(ra, self.dtype) is not False else None
        fa, fb, ct = self.fa, self.fb, self.ct
        n = len(ra) // fa.itemsize
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for first in range(0, n, CHUNK):  # pieces that stay in the CPU cache
                count = min(CHUNK, n - first)
                xa = np.frombuffer(ra, dtype=fa, count=count, offset=first * fa.itemsize).astype(ct)
                yb = np.frombuffer(rb, dtype=fb, count=count, offset=first * fb.itemsize).astype(ct)
                ad = np.abs(np.subtract(xa, yb, out=xa), out=xa)
                top = float(ad.max())
                if not math.isfinite(top):
                    return None
                acc.max_abs = max(acc.max_abs, top)
                ref = np.abs(yb, out=yb)
                bound = np.multiply(ref, self.rtol)
                bound += self.atol
                acc.bad += int(np.count_nonzero(ad > bound))
                # max |a-b|/|b|: 0/0 (NaN) counts as equal, x/0 as inf; fmax skips NaNs
                rel = float(np.fmax.reduce(np.divide(ad, ref, out=bound)))
                if rel == rel:
                    acc.max_rel = max(acc.max_rel, rel)
        return acc

    def merge(self, part: Acc) -> None:
        acc = self.acc
        acc.max_abs = max(acc.max_abs, part.max_abs)
        acc.max_rel = max(acc.max_rel, part.max_rel)
        acc.bad += part.bad

    def result(self) -> ValueDiff:
        acc = self.acc
        return ValueDiff(self.key, acc.max_abs, acc.max_rel, 0, 0, 0, 0, acc.bad == 0, acc.bad, self.numel, self.cd)


def _numpy_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float) -> ValueDiff | None:
    """compare_pair's result for finite float16/32/64 values (_NumpyCompare), reading the pair here."""
    from .tensordata import iter_raw

    compare = _NumpyCompare(ta, tb, atol=atol, rtol=rtol)
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
    return (ta.storage is not None and tb.storage is not None and ta.dtype == tb.dtype and ta.shape == tb.shape
            and ta.numel > 0 and ta.is_contiguous and tb.is_contiguous)


def _quick_diffs(pairs: list[tuple[TensorMeta, TensorMeta]], *, atol: float,
                 rtol: float) -> Generator[ValueDiff | None, None, None]:
    """Per pair (same dtype and shape, contiguous), in order: its ValueDiff, or None to leave it to the caller.

    Worker threads read both sides chunk by chunk and check each chunk where
    they read it (tensordata.check_reads). A pair whose bytes are identical
    and finite gets a zero ValueDiff; a differing fp16/32/64 pair is
    compared with NumPy on the same chunks (_NumpyCompare), so it is never
    read twice. A pair with NaN/Inf, or of another dtype, that differs gets
    None at its first such chunk (its remaining chunks are passed over).
    """
    from .tensordata import all_finite, check_reads, group_reads, same_bytes

    # Small pairs (200,000 of them in some files) are read here and bit-tested in
    # batches: a thread hand-off and a NumPy call per pair would cost more than the bytes.
    small = _small_verdicts([p for p in pairs if p[0].nbytes < _SMALL_PAIR])
    large = [(ta, tb) for ta, tb in pairs if ta.nbytes >= _SMALL_PAIR]
    numeric = [_NumpyCompare(ta, tb, atol=atol, rtol=rtol) if _numpy_comparable(ta, tb) else None
               for ta, tb in large]
    reads, owner = group_reads(large)
    counts = Counter(owner)  # chunks per large pair
    given_up: set[int] = set()  # large pairs already left to the caller

    def check(i: int, a: Any, b: Any) -> Acc | None:
        compare = numeric[owner[i]]
        if compare is not None:
            return compare.chunk(a, b)
        return Acc() if same_bytes(a, b) and all_finite(a, large[owner[i]][0].dtype) is not False else None

    results = check_reads(reads, check, skip=lambda i: owner[i] in given_up)
    p = 0
    try:
        for ta, tb in pairs:
            if ta.nbytes < _SMALL_PAIR:
                yield _zero_diff(ta, tb) if small[id(ta), id(tb)] else None
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
    return ValueDiff(ta.key, 0.0, 0.0, 0, 0, 0, 0, True, 0, ta.numel, compare_dtype(ta.dtype, tb.dtype))


_SMALL_PAIR = 256 << 10  # bytes: pairs of smaller tensors are tested in batches, without the worker threads


def _small_verdicts(pairs: list[tuple[TensorMeta, TensorMeta]]) -> dict[tuple[int, int], bool]:
    """Per (id(a), id(b)) of small pairs: True if the bytes are the same and none is NaN/Inf (tested per batch)."""
    from .tensordata import RAW_CHUNK, all_finite, tensor_bytes

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
