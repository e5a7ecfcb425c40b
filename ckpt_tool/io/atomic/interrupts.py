"""SIGTERM and SIGHUP handled like Ctrl-C while an output is written.

A job scheduler that stops ckpt sends SIGTERM; turned into an exception,
it runs the same cleanup as Ctrl-C, so no temporary is left behind
(SIGKILL cannot be caught: staletemp.py removes what it leaves).
``deferred_interrupts`` holds those signals (and Ctrl-C) back for the few
steps that must not be split, such as creating a temporary and locking it.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


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
        with contextlib.suppress(ValueError, OSError):  # not allowed here (embedded interpreter): default action stays
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


_DEFERRED = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while the block runs; one that arrived meanwhile is
    delivered on leaving it, to the handler that was in force, exactly once per signal.

    Python raises KeyboardInterrupt between any two bytecodes of the main
    thread, so without this an interrupt can land after a temporary is
    created and before the code that would remove it knows it exists.
    Outside the main thread no signal raises anything: nothing to hold.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous: dict[int, Any] = {}
    done = [False]

    def hold(signum: int, frame: Any) -> None:
        if done[0]:  # still installed while the handlers are put back: act as the old one would
            _forward(previous[signum], signum, frame)
        else:
            pending.append(signum)

    for name in _DEFERRED:
        sig = getattr(signal, name, None)
        if sig is None or signal.getsignal(sig) is None:
            continue  # a handler installed outside Python: it cannot be put back, so leave it alone
        with contextlib.suppress(ValueError, OSError):  # not allowed here (embedded interpreter): acts as it would
            previous[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        done[0] = True
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)  # the old handler runs now (KeyboardInterrupt, Terminated, ...)


def _forward(old: Any, signum: int, frame: Any) -> None:
    """Run the handler ``old`` (a function, SIG_IGN or SIG_DFL) for a signal that arrived."""
    if callable(old):
        old(signum, frame)
    elif old == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
