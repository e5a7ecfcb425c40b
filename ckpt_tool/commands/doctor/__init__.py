"""``ckpt doctor``: can this environment run and verify checkpoints on its devices."""

# The surface siblings and users import (``from ckpt_tool.commands.doctor import run_doctor`` as before the
# package split); the modules below it are the feature's own.
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .command import DoctorReport, doctor, run_doctor

if TYPE_CHECKING:
    from .command import clean_temporaries as clean_temporaries

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "command": ("clean_temporaries",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["DoctorReport", "clean_temporaries", "command", "doctor", "run_doctor"]
