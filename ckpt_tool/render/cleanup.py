"""Text for stale temporaries: migrate's one line on stderr, and ``ckpt doctor --clean``'s report."""
from __future__ import annotations

from collections.abc import Sequence

from ..io.atomic import CleanReport, Temporary
from .common import human_bytes

_SHOWN = 3


def _paths(items: Sequence[Temporary]) -> str:
    shown = ", ".join(t.path for t in items[:_SHOWN])
    return shown + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def removed_line(removed: Sequence[Temporary]) -> str:
    """``ckpt: removed ...``: what migrate cleaned from OUT's folder before writing (one line)."""
    freed = human_bytes(sum(t.bytes for t in removed))
    if len(removed) == 1:
        return f"ckpt: removed a stale temporary output of a killed run ({freed} freed): {removed[0].path}"
    return f"ckpt: removed {len(removed)} stale temporary outputs of killed runs ({freed} freed): {_paths(removed)}"


_LABEL = {"stale": "removed", "live": "kept", "other-host": "kept", "unowned": "kept", "in-use": "kept"}


def cleanup_text(report: CleanReport) -> str:
    """One line per temporary found, then a summary line."""
    lines = []
    for t in report.found:
        if t.verdict == "stale":
            label = "FAILED" if t.error else ("stale" if report.dry_run else "removed")
        else:
            label = _LABEL.get(t.verdict, "kept")
        detail = t.reason + (f"; could not remove it: {t.error}" if t.error else "")
        lines.append(f"{label:<8} {human_bytes(t.bytes):>10}  {t.path}  ({detail})")
    where = report.folder + (" and below" if report.recursive else "")
    if not report.found:
        lines.append(f"no ckpt temporary outputs in {where}")
        return "\n".join(lines)
    kept = len(report.kept)
    if report.dry_run:
        stale = report.stale
        lines.append(f"dry run: {len(stale)} stale temporary output(s) would be removed "
                     f"({human_bytes(sum(t.bytes for t in stale))}); {kept} kept; nothing was removed")
    else:
        lines.append(f"removed {len(report.removed)} stale temporary output(s), {human_bytes(report.bytes_freed)} "
                     f"freed; {kept} kept" + (f"; {len(report.failed)} could not be removed" if report.failed else ""))
    return "\n".join(lines)
