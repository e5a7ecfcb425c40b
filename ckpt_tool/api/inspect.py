"""``ckpt_tool.inspect``: what is in a checkpoint, as ``ckpt inspect`` shows it."""
from __future__ import annotations

from ..commands.inspect import command as _command
from ..render.inspect import render
from .text import returning


class InspectReport(_command.InspectReport):
    """The command's InspectReport; ``str()`` is the text ``ckpt inspect PATH`` prints."""

    def __str__(self) -> str:
        return render(self)


inspect = returning(InspectReport, _command.inspect)

__all__ = ["InspectReport", "inspect"]
