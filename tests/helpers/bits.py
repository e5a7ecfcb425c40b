"""The one bit-equality check of tensors: same keys, dtypes, shapes and bytes.

torch.equal is not bitwise (NaN differs from itself, -0.0 equals 0.0), so
tensors are compared as their bytes, viewed as a flat uint8 tensor.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def bits(t: Any) -> Any:
    """A tensor's bytes in C order as a flat uint8 tensor: torch.equal on two of them is bit equality."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element tensor may keep any stride: view needs 1
        flat = flat.new_empty(flat.shape).copy_(flat)
    return flat.view(torch.uint8)


def raw_bytes(t: Any) -> bytes:
    """A tensor's bytes in C order, whatever its strides (empty for an empty tensor)."""
    return bits(t).numpy().tobytes() if t.numel() else b""


def same_bits(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same keys in the same order, and per key the same dtype, shape and bytes."""
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and raw_bytes(a[k]) == raw_bytes(b[k]) for k in a)


def assert_bit_equal(got: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """The same keys (in any order), and per key the same dtype, shape and bytes; a failure names the key."""
    import torch

    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(bits(got[k]), bits(v)), k
