"""Will the output fit? Checked against the file system before a byte is read or written.

A migration that runs out of space fails cleanly (nothing is left behind),
but only after reading and writing most of the data, which on a
consolidated output of hundreds of GB is an hour lost. The check compares
the bytes the plan will write, each file rounded up to the file system's
block size, plus ``MARGIN`` for the file system's own records, with the
space ``statvfs`` reports as available to unprivileged users (what ``df``
shows as Avail; a root-only reserve is not counted). Where the figure cannot
be had (``statvfs`` fails, or a file system reports no blocks at all, as some
network and FUSE file systems do) nothing is refused. Per-user quotas are not
visible to ``statvfs``: a write over a quota still fails at that point, cleanly.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import NotEnoughSpace

MARGIN = 1 << 20


@dataclass(frozen=True)
class Space:
    """What a check compared: the bytes needed (margin included) and the bytes available."""

    folder: str
    needed: int
    available: int | None  # None: the file system does not say

    @property
    def fits(self) -> bool:
        return self.available is None or self.needed <= self.available


def available(folder: str) -> tuple[int, int] | None:
    """(bytes available to unprivileged users, block size) of ``folder``'s file system; None if unknown."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None  # no statvfs (Windows), or the file system does not support it
    block = st.f_frsize or st.f_bsize
    if not st.f_blocks or not block:
        return None  # a file system that reports no size at all (some FUSE, proc-like mounts)
    return st.f_bavail * block, block


def needed(sizes: Sequence[int], block: int) -> int:
    """``sizes`` each rounded up to whole blocks, plus MARGIN."""
    return sum(-(-max(s, 0) // block) * block for s in sizes) + MARGIN


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def require(out: str, sizes: Callable[[], Sequence[int]], bound: tuple[int, int] | None = None) -> Space:
    """Raise NotEnoughSpace (exit 2) when the files ``sizes()`` plans would not fit beside ``out``.

    ``bound`` (at least the total bytes, at least the number of files) spares
    computing the exact sizes when even the bound fits.
    """
    folder = os.path.dirname(os.path.abspath(out)) or "."
    got = available(folder)
    if got is None:
        return Space(folder, 0, None)
    free, block = got
    if bound is not None:
        total, files = bound
        if total + files * block + MARGIN <= free:
            return Space(folder, total + files * block + MARGIN, free)
    space = Space(folder, needed(sizes(), block), free)
    if not space.fits:
        raise NotEnoughSpace(
            f"not enough free space: writing it needs {_human(space.needed)} ({space.needed} bytes, a "
            f"{_human(MARGIN)} margin included) but {folder} has {_human(space.available or 0)} "
            f"({space.available} bytes) free; free some space or write to another file system "
            "(nothing was read or written)", out)
    return space
