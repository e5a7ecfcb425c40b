"""DeepSpeed run folders (ZeRO 0-3, pipeline, tensor-parallel, universal) read as the consolidated model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .files import is_deepspeed as is_deepspeed, rank_file_hint as rank_file_hint

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "files": ("is_deepspeed", "rank_file_hint"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["is_deepspeed", "rank_file_hint"]
