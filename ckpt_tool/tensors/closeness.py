"""The exact comparison of two tensors' values, judged like torch.allclose(equal_nan=True), and its result.

values.py answers most pairs without torch (bytes, NumPy); every pair it
cannot (NaN/Inf, other dtypes, strided views) is compared here with torch,
chunk by chunk. ``ckpt diff --values`` reports the ValueDiffs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..model import TensorMeta

# Elements per step of the value comparison: bounds the temporaries (~25 MiB in all) at any tensor size.
CHUNK = 1 << 18


@dataclass(frozen=True)
class ValueDiff:
    """How far A's values are from B's for one key, judged like torch.allclose(equal_nan=True)."""

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

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key, "max_abs": _json_float(self.max_abs), "max_rel": _json_float(self.max_rel),
            "passed": self.passed, "mismatched": self.mismatched, "numel": self.numel,
            "nan_a": self.nan_a, "nan_b": self.nan_b, "inf_a": self.inf_a, "inf_b": self.inf_b,
            "compared_as": self.compared_as,
        }


def _json_float(x: float) -> float | str:
    """JSON has no NaN/Infinity: those become the strings "nan", "inf" (as in inspect)."""
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return x

def compare_dtype(a: str, b: str) -> str:
    """bf16 vs fp32 compares in fp32; anything with fp64 or an integer in fp64; complex in complex128."""
    from .. import dtypes

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

    from .nonfinite import tensor_nonfinite
    from .tensordata import iter_chunks

    if _threads is not None and not _threads:
        # One thread: on chunks this small, OpenMP workers spin-waiting for a busy
        # CPU cost 40x (measured: 10 s vs 0.2 s for 32M elements on a loaded 2-core machine).
        _threads.append(torch.get_num_threads())
        torch.set_num_threads(1)

    cd = compare_dtype(ta.dtype, tb.dtype)
    dt = getattr(torch, cd)
    same_dtype = ta.dtype == tb.dtype
    is_float = ta.is_floating or tb.is_floating or "complex" in (ta.dtype[:7], tb.dtype[:7])
    acc = Acc()
    for xs, ys in zip(iter_chunks(ta, CHUNK), iter_chunks(tb, CHUNK), strict=False):
        if same_dtype and torch.equal(xs.view(torch.uint8), ys.view(torch.uint8)):
            # bit-identical (the common case when checking a conversion): only count NaN/Inf
            n, i = tensor_nonfinite(xs) if is_float else (0, 0)
            if n or i:
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
class Acc:
    """A running comparison of one pair: merged chunk by chunk (mutable; never leaves tensors/)."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    bad: int = 0


def _finite_chunk(acc: Acc, ad: Any, yb: Any, atol: float, rtol: float) -> None:
    """Both sides finite here (max |a-b| is): the few passes a plain allclose needs (max_abs is done)."""
    import torch

    ref = yb.abs()
    acc.bad += int(torch.count_nonzero(ad > torch.mul(ref, rtol).add_(atol)))
    rel = torch.nan_to_num_(ad.div_(ref), nan=0.0, posinf=math.inf)  # 0/0: equal; x/0: inf
    acc.max_rel = max(acc.max_rel, float(rel.max()))


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
