"""One migrate output written by several processes: ``--workers N`` or torchrun ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....lazy import lazy_exports

if TYPE_CHECKING:
    from .choice import PARALLEL_FORMATS as PARALLEL_FORMATS, choose_workers as choose_workers
    from .owner import write_parallel as write_parallel
    from .torchrun import Dist as Dist, follower as follower

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "choice": ("PARALLEL_FORMATS", "choose_workers"),
    "owner": ("write_parallel",),
    "torchrun": ("Dist", "follower"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["PARALLEL_FORMATS", "Dist", "choose_workers", "follower", "write_parallel"]
