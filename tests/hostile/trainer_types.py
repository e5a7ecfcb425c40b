"""Classes a training script stores in its checkpoint metadata (importable where the reference loads)."""
from __future__ import annotations

import enum


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class TrainerState:
    """A trainer's own class: not on torch's weights_only allowlist."""

    def __init__(self, step: int = 0, best: float = 0.0) -> None:
        self.step = step
        self.best = best
