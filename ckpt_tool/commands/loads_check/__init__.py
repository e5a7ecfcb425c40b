"""What ``torch.load(path)`` (weights_only=True) does with a file or a folder, and the advice that follows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .verdict import WeightsOnlyReport as WeightsOnlyReport, assess as assess

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "verdict": ("WeightsOnlyReport", "assess"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["WeightsOnlyReport", "assess"]
