"""What every reader returns, and how it becomes a Checkpoint: the state_dict located and described."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .build import (
        build_checkpoint as build_checkpoint,
        file_danger as file_danger,
        located_tensors as located_tensors,
        reference_warnings as reference_warnings,
        summarize as summarize,
    )
    from .findings import join_walk as join_walk, name_calls as name_calls, needs_walk as needs_walk
    from .locate import resolve_key as resolve_key, tensors_of as tensors_of
    from .metas import (
        quantizer_meta as quantizer_meta,
        quantizer_note as quantizer_note,
        subclass_meta as subclass_meta,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "build": ("build_checkpoint", "file_danger", "located_tensors", "reference_warnings", "summarize"),
    "findings": ("join_walk", "name_calls", "needs_walk"),
    "locate": ("resolve_key", "tensors_of"),
    "metas": ("quantizer_meta", "quantizer_note", "subclass_meta"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "build_checkpoint", "file_danger", "join_walk", "located_tensors", "name_calls", "needs_walk", "quantizer_meta",
    "quantizer_note", "reference_warnings", "resolve_key", "subclass_meta", "summarize", "tensors_of",
]
