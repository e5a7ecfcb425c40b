"""torch.export ``.pt2`` archives (torch.export.save), read from their configs without torch.export.load."""
from __future__ import annotations

from .read import read_export

__all__ = ["read_export"]
