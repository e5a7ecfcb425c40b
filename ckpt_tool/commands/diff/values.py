"""``ckpt diff --values``: how far A's tensor values are from B's, pair by pair.

The only part of diff that reads tensor bytes. Pairs are streamed chunk by
chunk: identical, finite pairs cost a memcmp and a bit test, differing
float16/32/64 pairs NumPy's arithmetic, and only the rest (NaN/Inf, other
dtypes) torch, imported in the background while the fast paths run.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ...model import TensorMeta
from .report import ValueDiff

# Elements per step of the value comparison: bounds the temporaries (~25 MiB in all) at any tensor size.
_CHUNK = 1 << 18


def compare_values(
    pairs: Sequence[tuple[TensorMeta, TensorMeta]], *, atol: float, rtol: float,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[ValueDiff], list[str]]:
    """(one ValueDiff per pair, keys skipped because a side holds no data).

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
    try:
        for ta, tb in pairs:
            if ta.storage is None or tb.storage is None:
                skipped.append(ta.key)
                continue
            if next_quick is not None and next_quick[0] is ta and next_quick[1] is tb:
                next_quick = next(pending, None)
                found = next(verdicts)
                if found is not None:
                    results.append(found)
                    if progress is not None:
                        progress(ta.key)
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
            if progress is not None:
                progress(ta.key)
    finally:
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
        self.cd = _compare_dtype(ta.dtype, tb.dtype)
        self.ct = np.dtype(_NUMPY_FLOATS[self.cd])
        self.fa, self.fb = np.dtype(_NUMPY_FLOATS[ta.dtype]), np.dtype(_NUMPY_FLOATS[tb.dtype])
        self.same_dtype = ta.dtype == tb.dtype
        self.dtype = ta.dtype
        self.atol, self.rtol = self.ct.type(atol), self.ct.type(rtol)
        self.acc = _Acc()

    def chunk(self, ra: Any, rb: Any) -> _Acc | None:
        """One chunk of each side (the same elements) compared on its own; None: NaN/Inf, leave it to torch.

        Thread-safe (it changes nothing): chunks of one pair may be compared
        on several threads and their results merged in order (``merge``).
        """
        import numpy as np

        from ...tensors.tensordata import all_finite, same_bytes

        acc = _Acc()
        if self.same_dtype and same_bytes(ra, rb):
            return acc if all_finite(ra, self.dtype) is not False else None
        fa, fb, ct = self.fa, self.fb, self.ct
        n = len(ra) // fa.itemsize
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for first in range(0, n, _CHUNK):  # pieces that stay in the CPU cache
                count = min(_CHUNK, n - first)
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

    def merge(self, part: _Acc) -> None:
        acc = self.acc
        acc.max_abs = max(acc.max_abs, part.max_abs)
        acc.max_rel = max(acc.max_rel, part.max_rel)
        acc.bad += part.bad

    def result(self) -> ValueDiff:
        acc = self.acc
        return ValueDiff(self.key, acc.max_abs, acc.max_rel, 0, 0, 0, 0, acc.bad == 0, acc.bad, self.numel, self.cd)


def _numpy_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float) -> ValueDiff | None:
    """compare_pair's result for finite float16/32/64 values (_NumpyCompare), reading the pair here."""
    from ...tensors.tensordata import iter_raw

    compare = _NumpyCompare(ta, tb, atol=atol, rtol=rtol)
    for ra, rb in zip(iter_raw(ta, _CHUNK * compare.fa.itemsize), iter_raw(tb, _CHUNK * compare.fb.itemsize),
                      strict=False):
        part = compare.chunk(ra, rb)
        if part is None:
            return None
        compare.merge(part)
    return compare.result()


def _import_torch_in_background() -> None:
    """Start importing torch on a daemon thread; ``import torch`` later waits for it to finish."""
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
    from ...tensors.tensordata import all_finite, check_reads, group_reads, same_bytes

    # Small pairs (200,000 of them in some files) are read here and bit-tested in
    # batches: a thread hand-off and a NumPy call per pair would cost more than the bytes.
    small = _small_verdicts([p for p in pairs if p[0].nbytes < _SMALL_PAIR])
    large = [(ta, tb) for ta, tb in pairs if ta.nbytes >= _SMALL_PAIR]
    numeric = [_NumpyCompare(ta, tb, atol=atol, rtol=rtol) if _numpy_comparable(ta, tb) else None
               for ta, tb in large]
    reads, owner = group_reads(large)
    counts = Counter(owner)  # chunks per large pair
    given_up: set[int] = set()  # large pairs already left to the caller

    def check(i: int, a: Any, b: Any) -> _Acc | None:
        compare = numeric[owner[i]]
        if compare is not None:
            return compare.chunk(a, b)
        return _Acc() if same_bytes(a, b) and all_finite(a, large[owner[i]][0].dtype) is not False else None

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
    return ValueDiff(ta.key, 0.0, 0.0, 0, 0, 0, 0, True, 0, ta.numel, _compare_dtype(ta.dtype, tb.dtype))


_SMALL_PAIR = 256 << 10  # bytes: pairs of smaller tensors are tested in batches, without the worker threads


def _small_verdicts(pairs: list[tuple[TensorMeta, TensorMeta]]) -> dict[tuple[int, int], bool]:
    """Per (id(a), id(b)) of small pairs: True if the bytes are the same and none is NaN/Inf (tested per batch)."""
    from ...tensors.tensordata import RAW_CHUNK, all_finite, tensor_bytes

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


def _compare_dtype(a: str, b: str) -> str:
    """bf16 vs fp32 compares in fp32; anything with fp64 or an integer in fp64; complex in complex128."""
    from ... import dtypes

    kinds = {dtypes.lookup(a).kind, dtypes.lookup(b).kind}
    if "complex" in kinds:
        return "complex128"
    if "float64" in (a, b) or not kinds & {"float"}:
        return "float64"
    if kinds - {"float"}:  # a float against an integer: fp64 holds both exactly (up to 2**53)
        return "float64"
    return "float32"


def compare_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float,
                 _threads: list[int] | None = None) -> ValueDiff:
    """Max |a-b|, max |a-b|/|b|, NaN/Inf counts and allclose(a, b, rtol, atol, equal_nan=True).

    NaNs in the same place are equal (a checkpoint equals itself); a NaN
    against a number, or an Inf against anything but the same Inf, is an
    infinite difference and fails. Relative difference is against B (the
    expected side), as in torch.allclose: 0 where both are 0, inf where only B is.
    ``_threads`` (compare_values): torch is set to one thread on first use and
    the previous count is recorded there, for the caller to restore.
    """
    import torch

    from ...tensors.tensordata import iter_chunks

    if _threads is not None and not _threads:
        # One thread: on chunks this small, OpenMP workers spin-waiting for a busy
        # CPU cost 40x (measured: 10 s vs 0.2 s for 32M elements on a loaded 2-core machine).
        _threads.append(torch.get_num_threads())
        torch.set_num_threads(1)

    cd = _compare_dtype(ta.dtype, tb.dtype)
    dt = getattr(torch, cd)
    same_dtype = ta.dtype == tb.dtype
    is_float = ta.is_floating or tb.is_floating or "complex" in (ta.dtype[:7], tb.dtype[:7])
    acc = _Acc()
    for xs, ys in zip(iter_chunks(ta, _CHUNK), iter_chunks(tb, _CHUNK), strict=False):
        if same_dtype and torch.equal(xs.view(torch.uint8), ys.view(torch.uint8)):
            # bit-identical (the common case when checking a conversion): only count NaN/Inf
            if is_float and not bool(torch.isfinite(xs).all()):
                n, i = int(torch.isnan(xs).sum()), int(torch.isinf(xs).sum())
                acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b = acc.nan_a + n, acc.nan_b + n, acc.inf_a + i, acc.inf_b + i
            continue
        xa, yb = xs.to(dt), ys.to(dt)
        ad = torch.sub(xa, yb).abs_() if not xa.is_complex() else (xa - yb).abs()
        top = float(ad.max()) if ad.numel() else 0.0  # NaN if any element is: max propagates NaN
        if is_float and math.isfinite(top):
            acc.max_abs = max(acc.max_abs, top)
            _finite_chunk(acc, ad, yb, atol, rtol)
        else:
            _general_chunk(acc, xs, ys, xa, yb, ad, not is_float, atol, rtol)
    return ValueDiff(ta.key, acc.max_abs, acc.max_rel, acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b, acc.bad == 0,
                     acc.bad, ta.numel, cd)


@dataclass
class _Acc:
    max_abs: float = 0.0
    max_rel: float = 0.0
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    bad: int = 0


def _finite_chunk(acc: _Acc, ad: Any, yb: Any, atol: float, rtol: float) -> None:
    """Both sides finite here (max |a-b| is): the few passes a plain allclose needs (max_abs is done)."""
    import torch

    ref = yb.abs()
    acc.bad += int(torch.count_nonzero(ad > torch.mul(ref, rtol).add_(atol)))
    rel = torch.nan_to_num_(ad.div_(ref), nan=0.0, posinf=math.inf)  # 0/0: equal; x/0: inf
    acc.max_rel = max(acc.max_rel, float(rel.max()))


def _general_chunk(acc: _Acc, xs: Any, ys: Any, xa: Any, yb: Any, ad: Any, exact_ints: bool,
                   atol: float, rtol: float) -> None:
    """NaN, Inf or integers in this chunk: equal_nan, same-signed Inf equal, anything else non-finite fails."""
    import torch

    xnan, ynan = torch.isnan(xa), torch.isnan(yb)
    acc.nan_a += int(xnan.sum())
    acc.nan_b += int(ynan.sum())
    acc.inf_a += int(torch.isinf(xa).sum())
    acc.inf_b += int(torch.isinf(yb).sum())
    same = (xs == ys) if exact_ints else ((xa == yb) | (xnan & ynan))
    zero = torch.zeros((), dtype=ad.dtype)
    diff = torch.where(same, zero, ad)
    diff = torch.where(torch.isnan(diff), torch.full((), math.inf, dtype=diff.dtype), diff)
    if exact_ints:  # int64 beyond 2**53: unequal even where fp64 cannot tell
        diff = torch.where(~same & (diff == 0), torch.ones((), dtype=diff.dtype), diff)
    ref = yb.abs()
    finite = torch.isfinite(xa) & torch.isfinite(yb)
    acc.bad += int(((diff > ref * rtol + atol) | (~same & ~finite)).sum())
    if diff.numel():
        acc.max_abs = max(acc.max_abs, float(diff.max()))
        rel = torch.where(diff == 0, zero, diff / ref)
        acc.max_rel = max(acc.max_rel, float(rel.max()))
