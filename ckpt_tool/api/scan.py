"""``ckpt_tool.scan``: the static scan of every pickle in the inputs, as ``ckpt scan`` reports it."""
from __future__ import annotations

from ..commands.scan import command as _command
from ..render.scan import render
from .text import returning


class ScanReport(_command.ScanReport):
    """The command's ScanReport; ``str()`` is the text ``ckpt scan PATH...`` prints (``exit_code`` is its code)."""

    def __str__(self) -> str:
        return render(self)


scan = returning(ScanReport, _command.scan)

__all__ = ["ScanReport", "scan"]
