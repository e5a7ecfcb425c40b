"""``ckpt scan``: every pickle in the inputs and what it would import, never run."""

# The surface siblings and users import (``from ckpt_tool.commands.scan import scan`` as before the
# package split); the modules below it are the feature's own.
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .call import ScanCall, scan
from .command import ScanOptions, ScanReport, scan_paths

if TYPE_CHECKING:
    from .command import FileScan as FileScan

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "command": ("FileScan",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["FileScan", "ScanCall", "ScanOptions", "ScanReport", "call", "command", "scan", "scan_paths"]
