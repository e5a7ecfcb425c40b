"""``ckpt_tool.gate``: the pre-deploy checks, each pass/fail, as ``ckpt gate`` reports them.

Inputs are files or folders (the gate vouches for what is deployed: its
bytes, size and pin); ``target`` is a SPEC, or an nn.Module class or instance.
"""
from __future__ import annotations

from ..commands.gate import command as _command
from ..render import gate_text as render
from .text import Shown, plural, returning


class GateReport(Shown, _command.GateReport):
    """The command's GateReport; ``str()`` is the text ``ckpt gate PATH...`` prints (``exit_code`` is its code)."""

    def __str__(self) -> str:
        return render(self)

    def summary(self) -> str:
        total = len(self.files)
        failed = sorted({str(c.name) for f in self.files for c in f.checks if not c.passed})
        if self.passed:
            return f"passed: {plural(total, 'checkpoint')}"
        bad = sum(1 for f in self.files if not f.passed)
        return f"FAILED: {bad} of {plural(total, 'checkpoint')} ({', '.join(failed) or 'unreadable'})"


gate = returning(GateReport, _command.gate)

__all__ = ["GateReport", "gate"]
