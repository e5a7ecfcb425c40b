"""``ckpt doctor``: can this environment run and verify checkpoints on its devices."""

# The surface siblings and users import (``from ckpt_tool.commands.doctor import run_doctor`` as before the
# package split); the modules below it are the feature's own.
from .command import DoctorReport, doctor, run_doctor

__all__ = ["DoctorReport", "doctor", "run_doctor"]
