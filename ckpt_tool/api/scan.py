"""``ckpt_tool.scan``: the static scan of every pickle in the inputs, as ``ckpt scan`` reports it.

Inputs are files and folders: the scan reads bytes, which an object in memory has none of.
"""
from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from typing import ParamSpec

from ..commands.scan import call as _call, command as _command
from ..errors import UsageError
from ..render import scan_text as render
from .text import Shown, plural, returning

P = ParamSpec("P")


class ScanReport(Shown, _command.ScanReport):
    """The command's ScanReport; ``str()`` is the text ``ckpt scan PATH...`` prints (``exit_code`` is its code)."""

    def summary(self) -> str:
        counts = Counter(str(f.verdict) for f in self.files)
        return f"{plural(len(self.files), 'file')}: " + (", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
                                                          or "nothing scanned")

    def __str__(self) -> str:
        return render(self)


def _paths_only(command: Callable[P, _command.ScanReport]) -> Callable[P, _command.ScanReport]:
    @functools.wraps(command)
    def call(*args: P.args, **kwargs: P.kwargs) -> _command.ScanReport:
        paths = args[0] if args else kwargs.get("paths")
        if isinstance(paths, (list, tuple)):
            held = [type(p).__name__ for p in paths if not isinstance(p, (str, os.PathLike))]
            if held:
                raise UsageError(f"scan reads the pickles of files and folders, not a {held[0]}: an object in "
                                 "memory was unpickled already (scan the file it came from)")
        return command(*args, **kwargs)

    return call


scan = returning(ScanReport, _paths_only(_call.scan))

__all__ = ["ScanReport", "scan"]
