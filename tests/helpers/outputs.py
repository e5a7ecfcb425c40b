"""An output as a user's loader reads it (bit-for-bit comparison: bits.py)."""
from __future__ import annotations

from pathlib import Path


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
