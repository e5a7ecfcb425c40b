"""``inspect --stats``: min/max/mean/std and NaN/Inf counts of one tensor, reading its bytes.

NaN and Inf are counted by the one counter (nonfinite.py), float8 included;
the other figures are taken over the finite values, in float64: of the
dequantized values of a quantized tensor, of the decoded fp4 values of a
float4_e2m1fn_x2 one, none for the bits types (bit patterns, not numbers).
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import dtypes
from ...model import TensorMeta


@dataclass(frozen=True)
class TensorStats:
    key: str
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int


def compute_stats(t: TensorMeta) -> TensorStats:
    """min/max/mean/std over the finite values, and NaN/Inf counts (None figures where there are none)."""
    import torch

    from ..data import to_torch
    from .bitwise import comparable, needs_values
    from .nonfinite import tensor_nonfinite

    kind = dtypes.lookup(t.dtype).kind
    if kind == "bits":  # bit patterns, not numbers: no meaningful figures
        return TensorStats(t.key, None, None, None, None, 0, 0)
    # quantized: the dequantized values; float4_e2m1fn_x2: its fp4 values decoded (torch has no cast for it)
    x = comparable(t) if needs_values(t.dtype) else to_torch(t)
    if x.numel() == 0 or x.dtype == torch.bool or x.is_complex():
        return TensorStats(t.key, None, None, None, None, 0, 0)
    nan, inf = tensor_nonfinite(x)
    xf = x.to(torch.float64)
    finite = xf[torch.isfinite(xf)] if nan or inf else xf.reshape(-1)
    if finite.numel() == 0:
        return TensorStats(t.key, None, None, None, None, nan, inf)
    std = float(finite.std()) if finite.numel() > 1 else 0.0
    return TensorStats(t.key, float(finite.min()), float(finite.max()), float(finite.mean()), std, nan, inf)
