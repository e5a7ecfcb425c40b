"""The exact comparison of two tensors' values, judged like torch.allclose(equal_nan=True), and its result.

values.py answers most pairs without torch (bytes, NumPy); every pair it
cannot (NaN/Inf, other dtypes, strided views) is compared here with torch,
chunk by chunk. ``ckpt diff --values`` reports the ValueDiffs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...model import TensorMeta

# Elements per step of the value comparison: bounds the temporaries (~25 MiB in all) at any tensor size.
CHUNK = 1 << 18


class SumFigures:
    """The figures derived from a comparison's float64 sums, for one tensor (ValueDiff) or a group of them
    (commands/diff/rollup.py): the sums of the group are its tensors' sums added up."""

    numel: int
    mismatched: int
    sum_abs: float
    sq_diff: float
    sq_a: float
    sq_b: float
    dot: float

    def all_equal(self) -> bool:
        """Every element equal (a cosine of 1 however the sums round)."""
        raise NotImplementedError

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.numel if self.numel else 0.0

    @property
    def rel_l2(self) -> float:
        """||B-A|| / ||A||: 0 for equal values (even all zeros), inf where A's norm is 0 and B differs."""
        return rel_l2(self.sq_diff, self.sq_a)

    @property
    def cosine(self) -> float:
        """As torch.nn.functional.cosine_similarity (eps 1e-8) of the finite elements; 1 for equal values."""
        return 1.0 if self.all_equal() else cosine(self.dot, self.sq_a, self.sq_b)

    @property
    def mismatched_share(self) -> float:
        return self.mismatched / self.numel if self.numel else 0.0


@dataclass(frozen=True)
class ValueDiff(SumFigures):
    """How far A's values are from B's for one key, judged like torch.allclose(equal_nan=True).

    Element differences ``d``: 0 where both sides hold the same value (NaN
    against NaN, the same Inf), inf where they differ and either is NaN or
    Inf, else ``|a - b|``. The sums are float64 over the whole tensor:
    ``sum_abs`` = sum d, ``sq_diff`` = sum d**2; ``sq_a``, ``sq_b``, ``dot``
    = sum a**2, b**2, a*b over the elements where both sides are finite.
    ``norms`` is False where those three were not read (an identical pair
    with only the per-tensor figures asked for: no rollup needs them).
    """

    key: str
    max_abs: float
    max_rel: float
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    passed: bool
    mismatched: int = 0  # elements outside atol + rtol * |b|
    numel: int = 0
    compared_as: str = ""  # the dtype both sides were compared in
    sum_abs: float = 0.0
    sq_diff: float = 0.0
    sq_a: float = 0.0
    sq_b: float = 0.0
    dot: float = 0.0
    norms: bool = False
    # fixed-bin histograms (histograms.py) of A, B and B-A, when asked for; () otherwise
    hist_a: tuple[int, ...] = ()
    hist_b: tuple[int, ...] = ()
    hist_diff: tuple[int, ...] = ()

    @property
    def same(self) -> bool:
        """Every element equal (NaN against NaN, the same Inf included)."""
        return self.max_abs == 0 and self.sq_diff == 0 and self.mismatched == 0

    def all_equal(self) -> bool:
        return self.same

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "max_abs": json_float(self.max_abs), "max_rel": json_float(self.max_rel),
            "mean_abs": json_float(self.mean_abs), "rel_l2": json_float(self.rel_l2),
            "cosine": json_float(self.cosine), "mismatched_share": self.mismatched_share,
            "norm_a": json_float(math.sqrt(self.sq_a)) if self.norms else None,
            "norm_b": json_float(math.sqrt(self.sq_b)) if self.norms else None,
            "norm_diff": json_float(math.sqrt(self.sq_diff)),
            "passed": self.passed, "mismatched": self.mismatched, "numel": self.numel,
            "nan_a": self.nan_a, "nan_b": self.nan_b, "inf_a": self.inf_a, "inf_b": self.inf_b,
            "compared_as": self.compared_as,
        }


COSINE_EPS = 1e-8  # torch.nn.functional.cosine_similarity's default


def rel_l2(sq_diff: float, sq_a: float) -> float:
    """sqrt(sq_diff) / sqrt(sq_a), with 0 when nothing differs and inf when only the denominator is 0."""
    if sq_diff == 0:
        return 0.0
    if sq_a == 0:
        return math.inf
    return math.sqrt(sq_diff) / math.sqrt(sq_a)


def cosine(dot: float, sq_a: float, sq_b: float) -> float:
    """dot / (max(||a||, eps) * max(||b||, eps)): torch's cosine_similarity from the sums."""
    return dot / (max(math.sqrt(sq_a), COSINE_EPS) * max(math.sqrt(sq_b), COSINE_EPS))


def worst(x: float, y: float) -> float:
    """The larger of two differences, a NaN counting as inf.

    Python's ``max`` keeps its first argument when the other is NaN
    (``max(0.0, nan) == 0.0``, ``max(nan, 1.0)`` is nan), which made a NaN
    produced along the way (inf/inf, x/NaN) vanish or win depending on the
    order of the chunks; every merge goes through here instead.
    """
    if x != x or y != y:
        return math.inf
    return x if x >= y else y


def json_float(x: float) -> float | str:
    """JSON has no NaN/Infinity: those become the strings "nan", "inf" (as in inspect)."""
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return x


def compare_dtype(a: str, b: str) -> str:
    """bf16 vs fp32 compares in fp32; anything with fp64 or an integer in fp64; complex in complex128."""
    from ... import dtypes

    kinds = {dtypes.lookup(a).kind, dtypes.lookup(b).kind}
    if kinds & {"quantized"} and kinds <= {"quantized", "float"}:  # dequantized values (tensors/bitwise.py)
        return "float64" if "float64" in (a, b) else "float32"
    if "complex" in kinds:
        return "complex128"
    if "float64" in (a, b) or not kinds & {"float"}:
        return "float64"
    if kinds - {"float"}:  # a float against an integer: fp64 holds both exactly (up to 2**53)
        return "float64"
    return "float32"


def compared_as(a: str, b: str) -> str:
    """What ValueDiff.compared_as says: compare_dtype's, or for two tensors read through bitwise.py (bits,
    float4, quantized, sub-byte integers) of the same kind the dtype they were read as (uint8, float32)."""
    from .bitwise import compared_dtype, needs_values

    if (needs_values(a) or needs_values(b)) and compared_dtype(a) == compared_dtype(b):
        return compared_dtype(a)
    return compare_dtype(a, b)


def compare_pair(ta: TensorMeta, tb: TensorMeta, *, atol: float, rtol: float, histograms: bool = False,
                 _threads: list[int] | None = None) -> ValueDiff:
    """Max |a-b|, max |a-b|/|b|, the float64 sums, NaN/Inf counts and allclose(a, b, rtol, atol, equal_nan=True).

    NaNs in the same place are equal (a checkpoint equals itself); a NaN
    against a number, or an Inf against anything but the same Inf, is an
    infinite difference and fails. Relative difference is against B (the
    expected side), as in torch.allclose: 0 where both are 0, inf where only
    B is, or where the difference is infinite. ``histograms``: also bin A, B
    and B-A (histograms.py). ``_threads`` (compare_values): torch is set to
    one thread on first use and the previous count is recorded there, for
    the caller to restore.
    """
    import torch

    from ... import dtypes
    from ..data import iter_chunks
    from .bitwise import comparable_chunks, compared_dtype, compared_numel, needs_values
    from .nonfinite import tensor_nonfinite

    if _threads is not None and not _threads:
        # One thread: on chunks this small, OpenMP workers spin-waiting for a busy
        # CPU cost 40x (measured: 10 s vs 0.2 s for 32M elements on a loaded 2-core machine).
        _threads.append(torch.get_num_threads())
        torch.set_num_threads(1)

    cd = compare_dtype(ta.dtype, tb.dtype)
    dt = getattr(torch, cd)
    same_dtype = ta.dtype == tb.dtype
    is_float = ta.is_floating or tb.is_floating or "complex" in (ta.dtype[:7], tb.dtype[:7])
    acc = Acc(histograms=histograms)
    chunks_a, chunks_b, numel = iter_chunks(ta, CHUNK), iter_chunks(tb, CHUNK), ta.numel
    if needs_values(ta.dtype) or needs_values(tb.dtype):  # bits, float4, quantized: values torch can compare
        numel = compared_numel(ta)
        if numel != compared_numel(tb):  # float4 against another dtype: nothing to pair element by element
            return ValueDiff(ta.key, math.inf, math.inf, 0, 0, 0, 0, False, ta.numel, ta.numel, cd)
        da, db = compared_dtype(ta.dtype), compared_dtype(tb.dtype)
        same_dtype = da == db
        is_float = bool({dtypes.lookup(da).kind, dtypes.lookup(db).kind} & {"float", "complex"})
        chunks_a, chunks_b = comparable_chunks(ta, CHUNK), comparable_chunks(tb, CHUNK)
    for xs, ys in zip(chunks_a, chunks_b, strict=False):
        if same_dtype and torch.equal(xs.view(torch.uint8), ys.view(torch.uint8)):
            # bit-identical (the common case when checking a conversion): only count NaN/Inf and the norm
            n, i = tensor_nonfinite(xs) if is_float else (0, 0)
            if n or i:
                acc.nan_a, acc.nan_b, acc.inf_a, acc.inf_b = acc.nan_a + n, acc.nan_b + n, acc.inf_a + i, acc.inf_b + i
            _add_sums(acc, xs, xs, same=True)
            continue
        xa, yb = xs.to(dt), ys.to(dt)
        _add_sums(acc, xs, ys, same=False)
        ad = torch.sub(xa, yb).abs_() if not xa.is_complex() else (xa - yb).abs()
        top = float(ad.max()) if ad.numel() else 0.0  # NaN if any element is: max propagates NaN
        if is_float and math.isfinite(top):
            acc.max_abs = worst(acc.max_abs, top)
            _finite_chunk(acc, ad, yb, atol, rtol)
        else:
            _general_chunk(acc, xs, ys, xa, yb, ad, not is_float, atol, rtol)
    return acc.result(ta.key, numel, compared_as(ta.dtype, tb.dtype))


@dataclass
class Acc:
    """A running comparison of one pair: merged chunk by chunk (mutable; never leaves tensors/)."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    bad: int = 0
    sum_abs: float = 0.0
    sq_diff: float = 0.0
    sq_a: float = 0.0
    sq_b: float = 0.0
    dot: float = 0.0
    norms: bool = True
    histograms: bool = False
    unbinned: int = 0  # identical chunks left out of the histograms (values.py reads such a pair again)
    hist: list[Any] = field(default_factory=list)  # NumPy int64 counts of A, B, B-A once histograms start

    def merge(self, part: Acc) -> None:
        """Add a later chunk's figures (chunks compared apart, on worker threads)."""
        self.max_abs, self.max_rel = worst(self.max_abs, part.max_abs), worst(self.max_rel, part.max_rel)
        self.nan_a, self.nan_b = self.nan_a + part.nan_a, self.nan_b + part.nan_b
        self.inf_a, self.inf_b = self.inf_a + part.inf_a, self.inf_b + part.inf_b
        self.bad += part.bad
        self.sum_abs += part.sum_abs
        self.sq_diff += part.sq_diff
        self.sq_a += part.sq_a
        self.sq_b += part.sq_b
        self.dot += part.dot
        self.norms = self.norms and part.norms
        self.unbinned += part.unbinned
        if part.hist:
            if not self.hist:
                self.hist = [h.copy() for h in part.hist]
            else:
                for mine, theirs in zip(self.hist, part.hist, strict=True):
                    mine.__iadd__(theirs)  # in place: the NumPy counts this Acc owns

    def add_histograms(self, a: Any, b: Any) -> None:
        """Bin a sample of this chunk's A, B and B-A (float64 NumPy arrays of the same elements)."""
        from .histograms import add_counts, new_counts, sampled

        if not self.hist:
            self.hist = [new_counts(), new_counts(), new_counts()]
        a, b = sampled(a), sampled(b)
        add_counts(self.hist[0], a)
        add_counts(self.hist[1], b)
        add_counts(self.hist[2], b - a)

    def result(self, key: str, numel: int, compared_as: str) -> ValueDiff:
        hists: list[tuple[int, ...]] = [tuple(int(c) for c in h) for h in self.hist] or [(), (), ()]
        if self.unbinned:  # part of the values is missing from the bins: none rather than wrong ones
            hists = [(), (), ()]
        return ValueDiff(key, self.max_abs, self.max_rel, self.nan_a, self.nan_b, self.inf_a, self.inf_b,
                         self.bad == 0, self.bad, numel, compared_as, self.sum_abs, self.sq_diff, self.sq_a,
                         self.sq_b, self.dot, self.norms, hists[0], hists[1], hists[2])


def _add_sums(acc: Acc, xs: Any, ys: Any, *, same: bool) -> None:
    """The float64 sums of one chunk (ValueDiff's docstring says which elements each covers)."""
    import torch

    if xs.is_complex() or ys.is_complex():  # |a|**2 and Re(a * conj(b)); d = |a - b|
        a, b = xs.to(torch.complex128), ys.to(torch.complex128)
        fin = torch.isfinite(a) & torch.isfinite(b)
        af, bf = a[fin], b[fin]
        acc.sq_a += float(af.abs().square().sum())
        acc.sq_b += float(bf.abs().square().sum())
        acc.dot += float((af * bf.conj()).real.sum())
        if not same:
            d = (a - b).abs()
            d = torch.where((a == b) | (torch.isnan(a) & torch.isnan(b)), 0.0,
                            torch.nan_to_num(d, nan=math.inf, posinf=math.inf))
            acc.sum_abs += float(d.sum())
            acc.sq_diff += float(d.square().sum())
        return
    a, b = xs.to(torch.float64), ys.to(torch.float64)
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    fin = fin_a & fin_b
    all_fin = bool(fin.all())
    af, bf = (a, b) if all_fin else (a[fin], b[fin])
    sq = float(torch.dot(af, af))
    acc.sq_a += sq
    if same:  # this chunk's own sums (an earlier chunk may have differed)
        acc.sq_b += sq
        acc.dot += sq
        return
    acc.sq_b += float(torch.dot(bf, bf))
    acc.dot += float(torch.dot(af, bf))
    d = b - a
    if not all_fin:  # the same NaN or Inf on both sides: 0; any other non-finite pair: inf
        equal = (a == b) | (torch.isnan(a) & torch.isnan(b))
        d = torch.where(equal, 0.0, torch.where(fin, d, math.inf))
    acc.sum_abs += float(d.abs().sum())
    acc.sq_diff += float(torch.dot(d, d)) if all_fin else float(d.square().sum())
    if acc.histograms:
        acc.add_histograms(a.numpy(), b.numpy())


def _finite_chunk(acc: Acc, ad: Any, yb: Any, atol: float, rtol: float) -> None:
    """Both sides finite here (max |a-b| is): the few passes a plain allclose needs (max_abs is done)."""
    import torch

    ref = yb.abs()
    acc.bad += int(torch.count_nonzero(ad > torch.mul(ref, rtol).add_(atol)))
    rel = torch.nan_to_num_(ad.div_(ref), nan=0.0, posinf=math.inf)  # 0/0: equal; x/0: inf
    acc.max_rel = worst(acc.max_rel, float(rel.max()))


def _general_chunk(acc: Acc, xs: Any, ys: Any, xa: Any, yb: Any, ad: Any, exact_ints: bool,
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
    inf = torch.full((), math.inf, dtype=ad.dtype)
    diff = torch.where(same, zero, ad)
    diff = torch.where(torch.isnan(diff), inf, diff)
    if exact_ints:  # int64 beyond 2**53: unequal even where fp64 cannot tell
        diff = torch.where(~same & (diff == 0), torch.ones((), dtype=diff.dtype), diff)
    ref = yb.abs()
    finite = torch.isfinite(xa) & torch.isfinite(yb)
    acc.bad += int(((diff > ref * rtol + atol) | (~same & ~finite)).sum())
    if diff.numel():
        acc.max_abs = worst(acc.max_abs, float(diff.max()))
        # an infinite difference is infinitely far in relative terms too: inf/inf and x/NaN would be NaN here
        rel = torch.where(diff == 0, zero, torch.where(torch.isinf(diff), inf, diff / ref))
        acc.max_rel = worst(acc.max_rel, float(torch.nan_to_num(rel, nan=math.inf, posinf=math.inf).max()))
