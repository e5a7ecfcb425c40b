"""Third-party classes libraries routinely put in checkpoints, reviewed from their source.

Each entry names the version its review read (``Entry.reviewed``). Classes of other libraries
and of users stay outside the catalog: the report says they are not reviewed.
"""
from __future__ import annotations

from .entry import Entry

ENTRIES: tuple[Entry, ...] = ()
