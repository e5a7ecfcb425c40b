"""Writing outputs that a crash, a full disk or Ctrl-C never leaves half-written: temporaries, space,
signals, renames.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .destination import check_destination as check_destination
    from .staletemp import CleanReport as CleanReport, Temporary as Temporary, clean as clean
    from .write import AtomicDir as AtomicDir, AtomicFile as AtomicFile
    from .writeback import Writeback as Writeback

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "destination": ("check_destination",),
    "staletemp": ("CleanReport", "Temporary", "clean"),
    "write": ("AtomicDir", "AtomicFile"),
    "writeback": ("Writeback",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "AtomicDir", "AtomicFile", "CleanReport", "Temporary", "Writeback", "check_destination", "clean", "destination",
    "freespace", "interrupts", "renames", "staletemp", "write",
]
