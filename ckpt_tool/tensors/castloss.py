"""What a dtype cast did to the values: overflows to inf/NaN, nonzeros flushed to zero, new subnormals.

migrate casts each tensor once, whole, in memory (writers/sourcebytes.py); the
counts are taken there, from the source and output values already in memory,
so proving a cast costs no second read of the file. NaN/Inf are counted by
the one counter (tensordata.count_raw_nonfinite); pre-existing NaN/Inf in the
source are not counted as new.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CastLoss:
    """Per tensor: how many values the cast changed in kind (not merely rounded)."""

    new_nonfinite: int = 0  # finite in the source, inf or NaN in the output (overflow)
    saturated: int = 0  # beyond the output's range but stored finite (float8_e4m3fn clamps to 448; inf too)
    flushed: int = 0  # nonzero in the source, zero in the output (underflow)
    subnormal: int = 0  # normal in the source, subnormal in the output (precision lost near zero)

    @property
    def any(self) -> bool:
        return bool(self.new_nonfinite or self.saturated or self.flushed or self.subnormal)

    @property
    def overflowed(self) -> int:
        """Values the cast did not merely round: turned inf/NaN, or clamped to the largest finite value."""
        return self.new_nonfinite + self.saturated


NONE = CastLoss()


def _raw(x: Any) -> Any:
    """The bytes of a contiguous CPU tensor, without a copy."""
    import torch

    return x.reshape(-1).view(torch.uint8).numpy()


def _widens(src: Any, out: Any) -> bool:
    """True when every ``src`` value is exactly representable in ``out`` (fp16 -> fp32, bf16 -> fp32)."""
    import torch

    if not (src.is_floating_point and out.is_floating_point):
        return False
    a, b = torch.finfo(src), torch.finfo(out)
    return b.max >= a.max and b.smallest_normal <= a.smallest_normal and b.eps <= a.eps


@functools.lru_cache(maxsize=16)
def _rounds_to_max(dtype: Any) -> float:
    """The magnitude from which a value no longer rounds to ``dtype``'s largest finite value (its max plus
    half the step below it): a larger source value stored finite was clamped, not rounded."""
    import torch

    top = torch.finfo(dtype).max
    if torch.finfo(dtype).bits <= 16:  # every value of the dtype, to find the one below the max
        raw = torch.arange(1 << torch.finfo(dtype).bits, dtype=torch.int32)
        values = raw.to(torch.uint8 if torch.finfo(dtype).bits == 8 else torch.int16).view(dtype).to(torch.float64)
        finite = values[torch.isfinite(values) & (values < top)]
        below = float(finite.max())
    else:
        below = float(torch.nextafter(torch.tensor(top, dtype=dtype), torch.tensor(0.0, dtype=dtype)))
    return float(top) + (float(top) - below) / 2


def cast_with_loss(x: Any, dtype: Any, count: bool = True) -> tuple[Any, CastLoss]:
    """``x.to(dtype)`` (torch's round to nearest even) and what it lost, counted in memory.

    ``x`` is a CPU tensor; the counts compare each source value with its cast
    (``count=False``: a re-computation whose counts are known, none taken).
    """
    import torch

    from .tensordata import count_raw_nonfinite

    y = x.to(dtype).contiguous()
    if not count or y.numel() == 0 or not x.is_floating_point() or _widens(x.dtype, y.dtype):
        return y, NONE
    src_name = str(x.dtype).removeprefix("torch.")
    out_name = str(y.dtype).removeprefix("torch.")
    xs = x.contiguous()
    before = sum(count_raw_nonfinite(_raw(xs), src_name))
    after = sum(count_raw_nonfinite(_raw(y), out_name))
    # compare in the wider of the two (float8 has few kernels; float64 sources keep their range)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    xw = xs if xs.dtype == wide else xs.to(wide)
    yw = y.to(wide)
    src_zero = int((xw == 0).sum())
    out_zero = int((yw == 0).sum())
    tiny_out = torch.finfo(y.dtype).smallest_normal
    tiny_src = torch.finfo(x.dtype).smallest_normal
    ya = yw.abs()
    xa = xw.abs()
    subnormal = int(((ya < tiny_out) & (ya > 0) & (xa >= tiny_src)).sum())
    saturated = 0
    if float(xa.max()) >= float(torch.finfo(y.dtype).max):  # NaN sources compare False, inf ones True
        saturated = int(((xa.to(torch.float64) >= _rounds_to_max(y.dtype)) & torch.isfinite(yw)).sum())
    return y, CastLoss(max(0, after - before), saturated, max(0, out_zero - src_zero), subnormal)
