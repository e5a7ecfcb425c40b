"""safetensors files: the JSON header alone, validated as strictly as the format demands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .header import restore_aliases as restore_aliases

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "header": ("restore_aliases",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["restore_aliases"]
