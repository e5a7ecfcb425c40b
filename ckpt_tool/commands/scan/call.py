"""``scan(paths, *, strict=..., ...)``: the Python verb, its keywords declared once (commands/keywords.py)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ...formats import Limited
from ..keywords import options_of, source_of, verb
from .command import ScanOptions, ScanReport, scan_paths


@dataclass(frozen=True)
class ScanCall(ScanOptions, Limited):
    """Scan files and folders (recursively) for pickles and judge what they would import.

    A file named explicitly that holds nothing to scan (no pickle, zip, tar,
    NumPy or safetensors data, or nothing at all) is an error, unless
    ``skip_other`` (for hooks that pass every file of a commit); inside
    folders such files are skipped. A folder or file that cannot be read is
    an error, never skipped. ``allow_globals`` ("module.name") count as inert.
    """

    paths: Sequence[str | os.PathLike[str]]


def _called(call: ScanCall) -> ScanReport:
    return scan_paths(call.paths, source_of(call), options_of(ScanOptions, call))


scan = verb("scan", ScanCall, _called)

__all__ = ["ScanCall", "scan"]
