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


def summary(report: ScanReport) -> str:
    c = report.counts
    text = (f"scanned {len(report.files)} file{'s' if len(report.files) != 1 else ''}: "
            f"{c['safe']} safe, {c['suspicious']} suspicious, {c['dangerous']} dangerous, {c['error']} unreadable")
    if report.skipped:
        text += f"; skipped {len(report.skipped)} file(s) with nothing to scan"
    return text


def render(report: ScanReport, *, verbose: bool = False, quiet: bool = False) -> str:
    out: list[str] = []
    for f in report.files:
        if quiet and f.verdict == "safe":
            continue
        out.extend(_file_block(f, verbose))
    if verbose and report.skipped:
        out.append("skipped (no pickle, zip, tar, NumPy or safetensors data):")
        out.extend(f"    {p}" for p in report.skipped)
    out.append(summary(report))
    if any(f.verdict == "suspicious" for f in report.files) and not report.strict:
        out.append("suspicious: globals a pickle names but never calls or constructs (not on the inert "
                   "allowlist; torch.load imports their module); --strict fails on them")
    return "\n".join(out)
