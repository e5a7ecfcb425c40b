"""Per-rank torch.save files of DTensor and ShardedTensor state dicts, read statically as one model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .files import is_ranks_folder as is_ranks_folder, lone_rank_hint as lone_rank_hint

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "files": ("is_ranks_folder", "lone_rank_hint"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["is_ranks_folder", "lone_rank_hint"]
