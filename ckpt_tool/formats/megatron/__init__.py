"""Megatron-LM's checkpoints: legacy ``mp_rank_XX`` folders merged by rules, and ``torch_dist`` DCP folders.

Each name is imported from its module on first use (ckpt_tool/lazy.py):
detect.py's folder test does not import the torch_dist reader, nor a DCP read the legacy one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .legacy_folder import is_megatron_legacy as is_megatron_legacy, read_megatron_legacy as read_megatron_legacy
    from .torch_dist import describe as describe, unstack as unstack

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "legacy_folder": ("is_megatron_legacy", "read_megatron_legacy"),
    "torch_dist": ("describe", "unstack"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["describe", "is_megatron_legacy", "read_megatron_legacy", "unstack"]
