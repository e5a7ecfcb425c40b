"""``ckpt_tool.inspect``: what is in a checkpoint (a path, or a state dict or nn.Module in memory)."""
from __future__ import annotations

from ..commands.inspect import command as _command
from ..render import inspect_text as render
from ..units import human_bytes
from .text import Shown, plural, returning


class InspectReport(Shown, _command.InspectReport):
    """The command's InspectReport; ``str()`` is the text ``ckpt inspect PATH`` prints, ``repr()`` one line."""

    def __str__(self) -> str:
        return render(self)

    def summary(self) -> str:
        c = self.checkpoint
        return (f"{c.path!r}: {c.format}, {plural(len(c.tensors), 'tensor')}, {plural(c.total_numel, 'element')}, "
                f"{human_bytes(c.total_nbytes)}")


inspect = returning(InspectReport, _command.inspect)

__all__ = ["InspectReport", "inspect"]
