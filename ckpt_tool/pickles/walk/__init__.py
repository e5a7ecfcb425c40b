"""The static symbolic walk over a pickle's opcodes: what it would import and call, never running it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .walker import BytesRef as BytesRef, Finding as Finding, Walk as Walk, walk as walk

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "walker": ("BytesRef", "Finding", "Walk", "walk"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["BytesRef", "Finding", "Walk", "walk"]
