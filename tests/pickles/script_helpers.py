"""TorchScript functions in a module of their own: torch.jit.save writes them to a code file of their own."""
from __future__ import annotations

import torch


def make_file(path: str, n: int) -> torch.Tensor:
    """Creates ``path`` (torch.from_file with shared=True) when torch.jit.load runs it."""
    return torch.from_file(path, True, n)


def scale(x: torch.Tensor) -> torch.Tensor:
    """Benign: arithmetic only."""
    return torch.sqrt(torch.abs(x)) * 2.0 + x.mean()
