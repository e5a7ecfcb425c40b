"""``ckpt_tool.diff``: what happens if A's weights are loaded where B (or a target) is expected."""
from __future__ import annotations

from ..commands.diff import command as _command
from ..commands.diff.report import DiffReport as _DiffReport
from ..render.diff import render
from .text import returning


class DiffReport(_DiffReport):
    """The command's DiffReport; ``str()`` is the text ``ckpt diff A B`` prints."""

    def __str__(self) -> str:
        return render(self)


diff = returning(DiffReport, _command.diff)

__all__ = ["DiffReport", "diff"]
