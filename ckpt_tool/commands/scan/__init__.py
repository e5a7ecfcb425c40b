"""``ckpt scan``: every pickle in the inputs and what it would import, never run."""

# The surface siblings and users import (``from ckpt_tool.commands.scan import scan`` as before the
# package split); the modules below it are the feature's own.
from .command import ScanReport, scan

__all__ = ["ScanReport", "scan"]
