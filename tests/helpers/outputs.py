"""An output as a user's loader reads it, and bit-for-bit comparison of tensors (used by several test modules).

torch.equal is not bitwise (NaN, -0.0), so tensors are compared as their bytes.
"""
from __future__ import annotations

from pathlib import Path


def bits(t):  # a torch.Tensor (torch is imported by the tests only)
    """A tensor's bytes as a flat uint8 tensor: torch.equal on them is bit equality (NaN and -0.0 included)."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8)


def read_output(path: Path) -> dict:
    """What a user's loader gets: torch.load of a .pth, load_file of a .safetensors (aliases of tied tensors,
    which safetensors stores once, restored from the metadata)."""
    import torch

    if path.suffix == ".pth":
        return torch.load(path, weights_only=True)
    import safetensors.torch as st
    from safetensors import safe_open

    out = st.load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    out.update({k: out[v] for k, v in meta.items() if v in out and k not in out})
    return out


def assert_bit_equal(got: dict, expected: dict) -> None:
    """The same keys, and per key the same dtype, shape and bytes."""
    import torch

    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(bits(got[k]), bits(v)), k
