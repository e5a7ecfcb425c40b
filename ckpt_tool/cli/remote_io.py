"""URL options shared by the commands: --download, -v's request count, and the transfer progress bar."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

download_option = click.option(
    "--download", is_flag=True,
    help="For a URL whose server ignores byte-range requests: allow downloading the whole file "
         "(to a temporary file, removed afterwards). Without it such a URL is an error.")
verbose_option = click.option("-v", "--verbose", is_flag=True,
                              help="Also print on stderr how many requests and bytes reading URLs took.")

SHOW_AFTER = 8 << 20  # bytes fetched before a transfer bar appears: metadata reads stay silent


def _any_url(paths: Iterable[object]) -> bool:
    from ..io import is_url

    return any(isinstance(p, str) and is_url(p) for p in paths)


def transfer_bar(paths: Iterable[object], quiet: bool) -> bool:
    """Whether remote_scope shows its transfer bar (a command then leaves out a bar of its own:
    two bars on one terminal line overwrite each other)."""
    return not quiet and sys.stderr.isatty() and _any_url(paths)


@contextlib.contextmanager
def remote_scope(paths: Iterable[object], *, download: bool = False, verbose: bool = False,
                 quiet: bool = False) -> Iterator[None]:
    """Around a command: a remote session when a path is a URL (nothing at all otherwise).

    On a terminal, a progress bar with the bytes fetched and the rate
    appears once data (not just metadata) flows; ``-v`` prints the counts.
    """
    paths = list(paths)
    if not _any_url(paths):
        yield
        return
    from ..io.remote import remote_session as session

    with session(download=download) as sess:
        bar = _Transfer(sess) if transfer_bar(paths, quiet) else None
        try:
            yield
        finally:
            if bar is not None:
                bar.stop()
            if verbose:
                click.echo(f"remote: {sess.requests} requests, {_human(sess.bytes)} ({sess.bytes} bytes) fetched",
                           err=True)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


class _Transfer:
    """A click progress bar fed from the session's byte count by a polling thread."""

    def __init__(self, sess: Any) -> None:
        self.sess = sess
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ckpt-transfer", daemon=True)
        self._thread.start()

    def _total(self) -> int:
        return sum(getattr(f, "size", 0) for f in list(self.sess.files.values()))

    def _run(self) -> None:
        bar = None
        shown = 0
        start = time.monotonic()
        rate = [0.0]
        while not self._stop.wait(0.25):
            got = self.sess.bytes
            if bar is None:
                if got < SHOW_AFTER:
                    continue

                def label(_: object) -> str:
                    return f"{_human(self.sess.bytes)} at {_human(rate[0])}/s"

                bar = click.progressbar(length=max(self._total(), got, 1), label="fetching", file=sys.stderr,
                                        item_show_func=label, show_pos=False)
                bar.render_progress()
            rate[0] = got / max(time.monotonic() - start, 1e-3)
            bar.length = max(bar.length or 0, self._total(), got)
            bar.update(got - shown, got)
            shown = got
        if bar is not None:
            got = self.sess.bytes
            rate[0] = got / max(time.monotonic() - start, 1e-3)
            bar.update(got - shown, got)
            bar.render_finish()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
