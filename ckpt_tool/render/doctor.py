"""Text rendering of a DoctorReport."""
from __future__ import annotations

from ..commands.doctor import DoctorReport
from .common import human_bytes


def doctor_text(report: DoctorReport) -> str:
    lines = [
        f"ckpt        {report.ckpt}",
        f"python      {report.python}  ({report.platform})",
        f"torch       {report.torch or 'NOT INSTALLED'}",
        f"CUDA        {report.cuda or 'none (CPU build)'}"
        + (f", cuDNN {report.cudnn}" if report.cudnn else "")
        + f", {report.device_count} GPU(s) visible",
        "packages    " + ", ".join(f"{k} {v or 'missing'}" for k, v in report.packages.items()),
        "devices:",
    ]
    for d in report.devices:
        extra = ""
        if "total_memory" in d.properties:
            extra = f", capability {d.properties['capability']}, {human_bytes(d.properties['total_memory'])}"
        lines.append(f"  {'ok  ' if d.ok else 'FAIL'}  {d.device:<8} {d.name}{extra}")
        lines.append(f"        {d.detail} ({d.seconds * 1000:.1f} ms)")
    for note in report.notes:
        lines.append(f"note: {note}")
    for problem in report.problems:
        lines.append(f"problem: {problem}")
    lines.append(report.verdict)
    return "\n".join(lines)
