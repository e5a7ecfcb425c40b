"""What a dtype cast did to the values: overflows to inf/NaN, nonzeros flushed to zero, new subnormals.

migrate casts each tensor once, whole, in memory (writers/sourcebytes.py); the
counts are taken there, from the source and output values already in memory,
so proving a cast costs no second read of the file. NaN/Inf are counted by
the one counter (nonfinite.count_raw_nonfinite); pre-existing NaN/Inf in the
source are not counted as new.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import dtypes
from ...errors import UsageError
from ...model import TensorMeta

if TYPE_CHECKING:
    import torch


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


# dtype -> (unsigned NumPy code of its width, mask without the sign bit, exponent bits, bits that are
# clear only for a zero): a subnormal has its exponent clear and its mantissa not, a normal its exponent set.
_BITS: dict[str, tuple[str, int, int, int]] = {
    "float64": ("<u8", 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, 0x7FFF_FFFF_FFFF_FFFF),
    "float32": ("<u4", 0x7FFF_FFFF, 0x7F80_0000, 0x7FFF_FFFF),
    "float16": ("<u2", 0x7FFF, 0x7C00, 0x7FFF),
    "bfloat16": ("<u2", 0x7FFF, 0x7F80, 0x7FFF),
    "float8_e4m3fn": ("u1", 0x7F, 0x78, 0x7F),
    "float8_e5m2": ("u1", 0x7F, 0x7C, 0x7F),
    "float8_e4m3fnuz": ("u1", 0x7F, 0x78, 0xFF),  # 0x80 is the NaN, not a negative zero
    "float8_e5m2fnuz": ("u1", 0x7F, 0x7C, 0xFF),
}
_BLOCK = 1 << 20  # elements per NumPy step: the temporaries stay in the CPU cache


def _counts(src: Any, out: Any, src_name: str, out_name: str) -> tuple[int, int, int, int]:
    """(source zeros, output zeros, normal in the source but subnormal in the output, the source's
    largest magnitude as bits), read from the bits (magnitudes order like their bits; NaN above inf)."""
    import numpy as np

    s_code, s_abs, s_exp, s_zero = _BITS[src_name]
    o_code, o_abs, o_exp, o_zero = _BITS[out_name]
    xs, ys = np.frombuffer(src, dtype=s_code), np.frombuffer(out, dtype=o_code)
    src_zero = out_zero = subnormal = top = 0
    for i in range(0, xs.size, _BLOCK):
        x, y = xs[i:i + _BLOCK], ys[i:i + _BLOCK]
        xa, ya = x & s_abs, y & o_abs
        top = max(top, int(xa.max()))
        src_zero += x.size - int(np.count_nonzero(xa if s_zero == s_abs else x & s_zero))
        out_zero += y.size - int(np.count_nonzero(ya if o_zero == o_abs else y & o_zero))
        y_sub = ((y & o_exp) == 0) & (ya != 0)
        if y_sub.any():
            subnormal += int(np.count_nonzero(y_sub & ((x & s_exp) != 0)))
    return src_zero, out_zero, subnormal, top


@functools.lru_cache(maxsize=64)
def _max_bits(src: Any, out: Any) -> int:
    """Below which magnitude bits of ``src`` no value can reach ``out``'s largest finite value."""
    import torch

    at = torch.tensor(float(torch.finfo(out).max), dtype=torch.float64).to(src)
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[at.element_size()]
    bits = int(at.reshape(1).view(view)[0]) & _BITS[str(src).removeprefix("torch.")][1]
    return max(0, bits - 1)  # one step lower: the conversion may have rounded up


def cast_with_loss(x: Any, dtype: Any, count: bool = True) -> tuple[Any, CastLoss]:
    """``x.to(dtype)`` (torch's round to nearest even) and what it lost, counted in memory.

    ``x`` is a CPU tensor; the counts compare each source value with its cast
    (``count=False``: a re-computation whose counts are known, none taken).
    Zeros and subnormals are read from the bits with NumPy (torch's boolean
    reductions are ~10x slower); the clamp check runs only when some source
    value reaches the output's largest finite value.
    """
    import torch

    from .nonfinite import count_raw_nonfinite

    y = x.to(dtype).contiguous()
    if not count or y.numel() == 0 or not x.is_floating_point() or _widens(x.dtype, y.dtype):
        return y, NONE
    src_name = str(x.dtype).removeprefix("torch.")
    out_name = str(y.dtype).removeprefix("torch.")
    if src_name not in _BITS or out_name not in _BITS:  # refused, never published unchecked
        raise UsageError(f"a cast from {src_name} to {out_name}: ckpt cannot yet prove that such a cast keeps "
                         "the values; keep those tensors in their dtype (a rules file [cast] entry)")
    xs = x.contiguous()
    src_raw, out_raw = _raw(xs), _raw(y)
    before = sum(count_raw_nonfinite(src_raw, src_name))
    after = sum(count_raw_nonfinite(out_raw, out_name))
    src_zero, out_zero, subnormal, top = _counts(src_raw, out_raw, src_name, out_name)
    saturated = 0
    if top >= _max_bits(x.dtype, y.dtype):  # some value (or inf/NaN) reaches the output's range: count exactly
        wide = xs.to(torch.float64).abs()
        saturated = int(((wide >= _rounds_to_max(y.dtype)) & torch.isfinite(y.to(torch.float64))).sum())
    return y, CastLoss(max(0, after - before), saturated, max(0, out_zero - src_zero), subnormal)


def cast_tensor(meta: TensorMeta, dtype: str, *, count: bool = True) -> tuple[torch.Tensor, CastLoss]:
    """The tensor's data read into a CPU tensor and cast to ``dtype`` (any name dtypes.lookup knows: bf16, fp32)."""
    from ..data import to_torch, torch_dtype

    return cast_with_loss(to_torch(meta), torch_dtype(dtypes.lookup(dtype).name), count=count)


def cast_to_bytes(meta: TensorMeta, dtype: str, *, count: bool = True) -> tuple[bytes, CastLoss]:
    """cast_tensor's values as C-contiguous little-endian bytes (the writers' form)."""
    import torch

    x, loss = cast_tensor(meta, dtype, count=count)
    if x.numel() == 0:
        return b"", loss
    return bytes(x.reshape(-1).view(torch.uint8).numpy().tobytes()), loss


def fork_safe() -> None:
    """In a process forked from one where torch already ran: one intra-op thread.

    An OpenMP thread pool the parent started (a cast it made before, in the
    same Python process: an API caller's second migrate) does not survive
    fork, and the child's first parallel cast waits for it forever. A child
    that imports torch itself (the CLI's workers) keeps torch's defaults.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
