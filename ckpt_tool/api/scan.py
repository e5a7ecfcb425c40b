"""``ckpt_tool.scan``: the static scan of every pickle in the inputs, as ``ckpt scan`` reports it."""
from __future__ import annotations

from collections import Counter

from ..commands.scan import command as _command
from ..render.scan import render
from .text import Shown, plural, returning


class ScanReport(Shown, _command.ScanReport):
    """The command's ScanReport; ``str()`` is the text ``ckpt scan PATH...`` prints (``exit_code`` is its code)."""

    def summary(self) -> str:
        counts = Counter(str(f.verdict) for f in self.files)
        return f"{plural(len(self.files), 'file')}: " + (", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
                                                          or "nothing scanned")

    def __str__(self) -> str:
        return render(self)


scan = returning(ScanReport, _command.scan)

__all__ = ["ScanReport", "scan"]
