"""Text rendering of a GateReport: one line per check (pass, warn: passed with a warning, FAIL, skip), with its
detail."""
from __future__ import annotations

from ..commands.gate import GateReport


def gate_text(report: GateReport, *, quiet: bool = False) -> str:
    out: list[str] = []
    for f in report.files:
        out.append(f"{'PASSED' if f.passed else 'FAILED'}  {f.path}")
        if quiet and f.passed:
            continue
        width = max((len(c.name) for c in f.checks), default=0)
        for c in f.checks:
            if quiet and (c.passed or c.skipped):
                continue
            mark = "skip" if c.skipped else "warn" if c.warning else "pass" if c.passed else "FAIL"
            out.append(f"  {mark}  {c.name:<{width}}  {c.detail}")
    failed = sum(1 for f in report.files if not f.passed)
    total = len(report.files)
    out.append(f"gate {'passed' if report.passed else 'FAILED'}: "
               f"{total - failed} of {total} checkpoint{'s' if total != 1 else ''} passed")
    return "\n".join(out)
