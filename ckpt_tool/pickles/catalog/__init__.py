"""The reviewed catalog of globals a pickle may construct or call without side effects.

``CATALOG`` maps (module, name) to its reviewed Entry: the standard library's and torch's classes
(stdlib.py, torch_lib.py, enumerated by tools/catalog_candidates.py and decided by hand) and the
third-party classes libraries put in checkpoints (third_party.py, each for the version its review
read). pickles/inert.py consults it; anything outside it and the older REVIEWED table is not reviewed.
"""
from __future__ import annotations

from . import stdlib, third_party, torch_lib
from .entry import Decision, Entry

CATALOG: dict[tuple[str, str], Entry] = {e.pair: e for e in (*stdlib.ENTRIES, *torch_lib.ENTRIES,
                                                              *third_party.ENTRIES)}


def inert_entry(module: str, name: str) -> Entry | None:
    """The catalog's entry for a global it judged inert (or a trampoline); None otherwise."""
    entry = CATALOG.get((module, name))
    return entry if entry is not None and entry.decision != "excluded" else None

__all__ = ["CATALOG", "Decision", "Entry", "inert_entry"]
