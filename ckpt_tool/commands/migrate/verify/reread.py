"""Reading a written (temporary) output back with ckpt's own readers: the one way every check re-reads it.

The final verification (verify.py), the share checks of a multi-process
write (shares.py) and the check that follows a safetensors writer
(early.py) all open the output here, so that they see what any later
reader of the published output will see.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ....limits import Limits
from ....model import TensorMeta
from ....writers import file_location

if TYPE_CHECKING:
    from ....formats import Loaded


def open_output(path: str, limits: Limits, walk: bool = True) -> Loaded:
    """The reader's result for ``path`` (close_output closes it); a reader's CkptError goes on."""
    from ....formats import ReadOptions, read_file

    return read_file(path, ReadOptions(limits=limits, walk=walk))


def close_output(loaded: Loaded) -> None:
    for s in loaded.sources:
        s.close()


@contextmanager
def reread(path: str, limits: Limits, walk: bool = True) -> Iterator[Loaded]:
    """open_output's result, closed on leaving."""
    loaded = open_output(path, limits, walk)
    try:
        yield loaded
    finally:
        close_output(loaded)


def by_key(loaded: Loaded) -> Mapping[str, TensorMeta]:
    """The tensors of a flat output (a safetensors file or set), by key: what its reader holds at the root."""
    return dict(loaded.root)


def unreadable(message: str) -> str:
    """The failure of an output that cannot be read back (a failed verification, not an error)."""
    return f"the output cannot be read back: {message}"


def span_of(act: TensorMeta) -> tuple[int, int] | None:
    """(file offset, bytes) of a re-read tensor's bytes in its file: what a comparison proved, where it lies."""
    at = file_location(act, act.storage_offset * act.itemsize, act.nbytes)
    return (at[1], act.nbytes) if at is not None else None
