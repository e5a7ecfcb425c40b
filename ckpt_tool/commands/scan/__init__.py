"""``ckpt scan``: every pickle in the inputs and what it would import, never run."""

# The surface siblings and users import (``from ckpt_tool.commands.scan import scan`` as before the
# package split); the modules below it are the feature's own.
from .call import ScanCall, scan
from .command import ScanOptions, ScanReport, scan_paths

__all__ = ["ScanCall", "ScanOptions", "ScanReport", "scan", "scan_paths"]
