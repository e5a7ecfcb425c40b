"""``ckpt_tool.gate``: the pre-deploy checks, each pass/fail, as ``ckpt gate`` reports them."""
from __future__ import annotations

from ..commands.gate import command as _command
from ..render.gate import render
from .text import returning


class GateReport(_command.GateReport):
    """The command's GateReport; ``str()`` is the text ``ckpt gate PATH...`` prints (``exit_code`` is its code)."""

    def __str__(self) -> str:
        return render(self)


gate = returning(GateReport, _command.gate)

__all__ = ["GateReport", "gate"]
