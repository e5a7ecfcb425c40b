"""Renderers: text for people (tabulate), JSON for machines. No logic lives here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .cleanup import cleanup_text as cleanup_text, removed_line as removed_line
    from .common import dumps as dumps
    from .diff import diff_text as diff_text, verdict as verdict, write_csv as write_csv
    from .doctor import doctor_text as doctor_text
    from .gate import gate_text as gate_text
    from .inspect import inspect_text as inspect_text, json_text as json_text
    from .junit import write_junit as write_junit
    from .migrate import migrate_text as migrate_text
    from .sarif import gate_sarif as gate_sarif, scan_sarif as scan_sarif, write_sarif as write_sarif
    from .scan import scan_text as scan_text

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "cleanup": ("cleanup_text", "removed_line"),
    "common": ("dumps",),
    "diff": ("diff_text", "verdict", "write_csv"),
    "doctor": ("doctor_text",),
    "gate": ("gate_text",),
    "inspect": ("inspect_text", "json_text"),
    "junit": ("write_junit",),
    "migrate": ("migrate_text",),
    "sarif": ("gate_sarif", "scan_sarif", "write_sarif"),
    "scan": ("scan_text",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "cleanup_text", "diff_text", "doctor_text", "dumps", "gate_sarif", "gate_text", "inspect_text", "json_text",
    "migrate_text", "removed_line", "scan_sarif", "scan_text", "verdict", "write_csv", "write_junit", "write_sarif",
]
