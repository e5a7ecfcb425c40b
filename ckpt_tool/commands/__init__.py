
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .keywords import build_source as build_source

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "keywords": ("build_source",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["build_source"]
