"""Will ``torch.load(weights_only=True)`` load this pickle: the facts a walk finds, and torch's rules replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .inputs import (
        SAFETENSORS as SAFETENSORS,
        SHARDED as SHARDED,
        SMALL_PICKLE as SMALL_PICKLE,
        WeightsOnlyInput as WeightsOnlyInput,
        predict_input as predict_input,
    )
    from .predict import NEWEST as NEWEST, TABLE as TABLE, rules_for as rules_for

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "inputs": ("SAFETENSORS", "SHARDED", "SMALL_PICKLE", "WeightsOnlyInput", "predict_input"),
    "predict": ("NEWEST", "TABLE", "rules_for"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "NEWEST", "SAFETENSORS", "SHARDED", "SMALL_PICKLE", "TABLE", "WeightsOnlyInput", "inputs", "predict_input",
    "rules_for",
]
