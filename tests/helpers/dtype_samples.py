"""One small tensor of every dtype torch can save, built with real torch (generator for the dtype tests).

``sample(name)`` is the A side, ``variant(name)`` the same tensor with element 1 changed (the B side of a
diff that must find one mismatch). Dtypes torch has no arithmetic for (bits, float4) are built from
raw bytes with ``.view``; quantized ones with torch.quantize_per_tensor / per_channel.
"""
from __future__ import annotations

from typing import Any

import torch

# every dtype attribute of torch, by name (an alias such as torch.half maps to its canonical name)
TORCH_DTYPES: dict[str, Any] = {str(v).removeprefix("torch."): v for v in vars(torch).values()
                                if isinstance(v, torch.dtype)}
QUANTIZED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
FLOAT_VALUES = [0.5, -1.25, 3.0, 2.0]


def _savable(name: str) -> bool:
    import io

    dt = TORCH_DTYPES[name]
    try:
        torch.save(torch.zeros(dt.itemsize, dtype=torch.uint8).view(dt), io.BytesIO())
    except (KeyError, RuntimeError):  # KeyError: torch.save does not know the dtype (int1..int7, uint1..uint7)
        return False
    return True


def plain_names() -> list[str]:
    """Every dtype torch defines and can save, quantized ones left out (they need a quantizer)."""
    return sorted(n for n in TORCH_DTYPES if n not in QUANTIZED and _savable(n))


def sample(name: str, *, changed: bool = False) -> torch.Tensor:
    """A [2, 2] tensor of dtype ``name`` (``changed``: element [0, 1] differs, every other bit the same)."""
    dt = TORCH_DTYPES[name]
    if name in QUANTIZED:
        x = torch.tensor([[0.0, 0.125 if changed else 0.0], [-0.125, 0.125]])  # in range of every width
        return torch.quantize_per_tensor(x, 0.125, 0 if name.startswith("qint") else 2, dt)
    if name.startswith("bits") or name == "float4_e2m1fn_x2":
        raw = torch.tensor([0x12, 0x34, 0x56, 0x07] * dt.itemsize, dtype=torch.uint8)
        if changed:
            raw[dt.itemsize] ^= 0x01
        return raw.view(dt).reshape(2, 2)
    if name == "bool":
        return torch.tensor([[True, changed], [True, False]])
    if name == "float8_e8m0fnu":  # exponents only: powers of two
        return torch.tensor([[0.5, 4.0 if changed else 1.0], [2.0, 4.0]]).to(dt)
    if dt.is_floating_point or dt.is_complex:
        values = list(FLOAT_VALUES)
        if changed:
            values[1] *= 2
        return torch.tensor(values, dtype=torch.float32).to(dt).reshape(2, 2)
    values = [1, 2, 3, 100] if not dt.is_signed else [1, -2, 3, 100]
    if changed:
        values[1] += 1
    return torch.tensor(values, dtype=torch.int64).to(dt).reshape(2, 2)


def per_channel_qint8(*, changed: bool = False) -> torch.Tensor:
    x = torch.tensor([[0.5, -0.25, 1.0], [0.75, 0.125, 2.0 if changed else -2.0]])
    return torch.quantize_per_channel(x, torch.tensor([0.125, 0.25]), torch.tensor([0, 1]), 0, torch.qint8)


def all_samples(*, changed: bool = False) -> dict[str, torch.Tensor]:
    """One tensor per savable dtype, keyed by its name, plus the quantized ones (per channel too)."""
    out = {name: sample(name, changed=changed) for name in plain_names()}
    out.update({name: sample(name, changed=changed) for name in QUANTIZED})
    out["qint8_per_channel"] = per_channel_qint8(changed=changed)
    return out
