"""Text rendering of a ScanReport: one block per file, worst first within the list order."""
from __future__ import annotations

from ..commands.scan import FileScan, ScanReport


def _file_block(f: FileScan, verbose: bool) -> list[str]:
    head = f"{f.verdict.upper():<11} {f.path}  ({f.format}, {f.pickles} pickle{'s' if f.pickles != 1 else ''})"
    lines = [head]
    shown = [g for g in f.globals if verbose or g.severity != "safe"]
    width = max((len(g.qualname) for g in shown), default=0)
    for g in shown:
        lines.append(f"    {g.severity:<10}  {g.qualname:<{width}}  {g.where or 'pickle'}")
    for fi in f.findings:
        lines.append(f"    {fi.severity:<10}  {fi.message}" + (f"  [{fi.where}]" if fi.where else ""))
    for e in f.errors:
        lines.append(f"    error       {e}")
    return lines


SHOWN_SKIPPED = 10  # skipped files named without --verbose (all of them with it)


def summary(report: ScanReport) -> str:
    c = report.counts
    text = (f"scanned {len(report.files)} file{'s' if len(report.files) != 1 else ''}: "
            f"{c['safe']} safe, {c['suspicious']} suspicious, {c['dangerous']} dangerous, {c['error']} unreadable")
    if report.skipped:
        text += f"; skipped {len(report.skipped)} file(s) with nothing to scan"
    followed = sum(1 for link in report.links if link.action == "followed")
    if followed:
        text += f"; followed {followed} symbolic link(s)"
    return text


def _links(report: ScanReport, verbose: bool) -> list[str]:
    """Links to folders and links not followed always; links to files followed, with --verbose."""
    return [f"note: {link.describe()}" for link in report.links
            if link.action != "broken" and (verbose or link.kind == "folder" or link.action != "followed")]


def _skipped(report: ScanReport, verbose: bool) -> list[str]:
    rows = report.skipped_files()
    shown = rows if verbose else rows[:SHOWN_SKIPPED]
    out = ["skipped (nothing to scan):"] + [f"    {r['path']}  ({r['reason']})" for r in shown]
    if len(rows) > len(shown):
        out.append(f"    ... and {len(rows) - len(shown)} more (--verbose lists them)")
    return out


def scan_text(report: ScanReport, *, verbose: bool = False, quiet: bool = False) -> str:
    out: list[str] = []
    for f in report.files:
        if quiet and f.verdict == "safe":
            continue
        out.extend(_file_block(f, verbose))
    out.extend(_links(report, verbose))
    if report.skipped and not quiet:
        out.extend(_skipped(report, verbose))
    out.append(summary(report))
    if any(f.verdict == "suspicious" for f in report.files) and not report.strict:
        out.append("suspicious: globals a pickle names but never calls or constructs (not on the inert "
                   "allowlist; torch.load imports their module); --strict fails on them")
    return "\n".join(out)
