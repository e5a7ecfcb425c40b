"""The one progress contract of the core: every long step reports through it, the CLI draws it.

A step calls ``start(label, total)``, then ``advance(n)`` as units (bytes or
tensors, as the label says) are done, then ``done()``. The core never draws;
the CLI's single adapter turns this into progress bars on a terminal.
"""
from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Where a command reports work done."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def done(self) -> None: ...


class NoProgress:
    """The API's default: a caller that passes no ``progress`` sees none."""

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass


NO_PROGRESS = NoProgress()
