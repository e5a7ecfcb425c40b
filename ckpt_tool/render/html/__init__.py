"""``ckpt diff --values --html FILE``: the report as one self-contained HTML page (page.py, svg.py, assets.py)."""
from __future__ import annotations

from ...commands.diff import DiffReport
from ..common import write_report
from .page import html_text


def write_html(report: DiffReport, path: str) -> None:
    """Write html_text atomically (a temporary beside ``path``, fsync, rename)."""
    write_report(html_text(report).encode("utf-8"), path, "HTML report")

__all__ = ["html_text", "write_html"]
