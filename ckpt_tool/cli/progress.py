"""The one progress adapter: the core's Progress protocol (ckpt_tool/progress.py) as click bars on stderr.

Every command that reports progress hands the core a ``Bars``; bars are
drawn only on a terminal and never under ``-q`` (``progress_bars``). stdout
is never written, so ``--json`` output stays one document.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Protocol

import click

from .remote_io import transfer_bar


class _Bar(Protocol):
    """What Bars uses of click's ProgressBar."""

    def update(self, n_steps: int) -> None: ...

    def render_finish(self) -> None: ...


class Bars:
    """A Progress that draws one click progress bar per step (``start`` ... ``done``), or nothing when disabled.

    Redraws are throttled to about 200 per bar, so a file of 200,000
    tensors costs no more terminal writes than one of 200.
    """

    def __init__(self, enabled: bool, *, label_width: int = 0) -> None:
        self.enabled = enabled
        self.label_width = label_width  # labels padded to it, so that successive bars line up (migrate: 12)
        self._bar: _Bar | None = None
        self._pending = 0
        self._step = 1

    def start(self, label: str, total: int) -> None:
        self.done()
        if self.enabled:
            self._bar = click.progressbar(length=max(total, 1), label=label.ljust(self.label_width),
                                          file=sys.stderr)
            self._step = max(total // 200, 1)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._pending += n
            if self._pending >= self._step:
                self._bar.update(self._pending)
                self._pending = 0

    def done(self) -> None:
        if self._bar is not None:
            if self._pending:
                self._bar.update(self._pending)
            self._bar.render_finish()
            self._bar = None
        self._pending = 0


def progress_bars(*, quiet: bool, paths: Iterable[object] = (), label_width: int = 0) -> Bars:
    """The bars of one command run: on a terminal, not under -q, and not while a URL's transfer bar
    (cli/remote_io.py) holds the line (two bars on one line overwrite each other)."""
    paths = list(paths)
    return Bars(not quiet and sys.stderr.isatty() and not transfer_bar(paths, quiet), label_width=label_width)
