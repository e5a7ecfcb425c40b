"""SIGTERM and SIGHUP handled like Ctrl-C while an output is written.

A job scheduler that stops ckpt sends SIGTERM; turned into an exception,
it runs the same cleanup as Ctrl-C, so no temporary is left behind
(SIGKILL cannot be caught: staletemp.py removes what it leaves).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP arrived while writing; handled like Ctrl-C so temporaries are removed."""


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception while writing, so cleanup runs (SIGKILL cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass  # not allowed here (embedded interpreter): the default action stays
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
