"""``ckpt_tool.doctor``: python, torch and CUDA versions and devices, each device checked by a computation."""
from __future__ import annotations

from ..commands.doctor import command as _command
from ..render import doctor_text as render
from .text import Shown, returning


class DoctorReport(Shown, _command.DoctorReport):
    """The command's DoctorReport; ``str()`` is the text ``ckpt doctor`` prints."""

    def __str__(self) -> str:
        return render(self)

    def summary(self) -> str:
        devices = ", ".join(d.device for d in self.devices) or "no device checked"
        return f"{'ok' if self.ok else 'problems'}: torch {self.torch or 'not installed'}, {devices}"


doctor = returning(DoctorReport, _command.run_doctor)

__all__ = ["DoctorReport", "doctor"]
