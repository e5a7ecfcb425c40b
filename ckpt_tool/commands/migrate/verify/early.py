"""Comparing each tensor of a safetensors output with its source while the writer writes the next ones.

Writing is mostly the kernel's copying and the disk's writing (write-back
starts as the writer goes: io/atomic/writeback.py), so a second core sits
idle while it runs. An EarlyCheck follows the writer: once a batch of
tensors is in the file it re-reads them, as the output's reader places them
(the header is written first and parsed once), and compares them bit for
bit with the source on that core. What it proved is handed to the final
verification (verify.py), which re-reads the whole output with ckpt's
readers (reread.py, as here) and compares the bytes of every tensor it was not handed,
or whose place in the file is not the one proven. A tensor that differs is
never "proven": the final pass compares it again and names its first
differing byte.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from ....errors import CkptError
from ....limits import Limits
from ....model import DataSource, TensorMeta
from ....writers import OutTensor, file_location

BATCH = 32 << 20  # bytes written before a batch is compared
PART = 16 << 20  # a larger tensor is compared a part at a time as the writer passes it (the wait after the
# writer's last byte is then one batch, not the last large tensor: an embedding of hundreds of MiB)
MIN_BYTES = 256 << 20  # smaller outputs: the final pass alone (a thread and a second header parse cost more)
MAX_TENSORS = 20_000  # more: the second header parse costs more than the overlap wins

Proven = dict[str, tuple[int, int]]  # key -> (file offset, bytes) compared bit for bit with the source
Span = tuple[int, int, OutTensor, TensorMeta, str]  # (file offset, end, expected, re-read, whole tensor's key)


def _parts(t: OutTensor, act: TensorMeta, at: int) -> list[Span]:
    """``t`` whole, or (a plain copy larger than PART) flat views of PART bytes each."""
    src = t.source
    if t.nbytes <= PART or not t.streamable or not act.is_contiguous or act.nbytes != t.nbytes:
        return [(at, at + act.nbytes, t, act, t.key)]
    step = PART // t.itemsize
    out: list[Span] = []
    for first in range(0, t.numel, step):
        n = min(step, t.numel - first)
        exp = OutTensor(t.key, TensorMeta(t.key, src.dtype, (n,), None, src.storage_offset + first, src.storage),
                        t.dtype)
        got = TensorMeta(act.key, act.dtype, (n,), None, act.storage_offset + first, act.storage)
        out.append((at + first * t.itemsize, at + (first + n) * t.itemsize, exp, got, t.key))
    return out


class EarlyCheck:
    """Follows a safetensors writer (writers/safetensors/single.py's Follower) through the temporary output."""

    def __init__(self, path: str, tensors: Sequence[OutTensor], limits: Limits) -> None:
        self.path = path
        self.tensors = list(tensors)
        self.limits = limits
        self.proven: Proven = {}
        self._spans: list[Span] = []
        self._whole: dict[str, tuple[int, int]] = {}  # key -> (file offset, bytes) of the whole tensor
        self._left: dict[str, int] = {}  # key -> its parts not yet found equal
        self._next = 0
        self._pending: list[Span] = []
        self._pending_bytes = 0
        self._queue: queue.Queue[tuple[list[Span], int | None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._sources: list[DataSource] = []

    @staticmethod
    def worth_it(tensors: Sequence[OutTensor]) -> bool:
        return len(tensors) <= MAX_TENSORS and sum(t.nbytes for t in tensors) >= MIN_BYTES

    def started(self) -> None:
        """Parse the header just written (the reader verify.py uses) and start the comparing thread."""
        from .reread import open_output

        try:
            loaded = open_output(self.path, self.limits, walk=False)
        except CkptError:
            return  # the final verification reads it again and says why it cannot
        self._sources = list(loaded.sources)
        actual = dict(loaded.root)
        for t in self.tensors:
            act = actual.get(t.key)
            if not isinstance(act, TensorMeta) or act.dtype != t.dtype or tuple(act.shape) != tuple(t.shape):
                continue  # the final pass reports it
            at = file_location(act, act.storage_offset * act.itemsize, act.nbytes)
            if at is not None:
                parts = _parts(t, act, at[1])
                self._spans.extend(parts)
                self._whole[t.key] = (at[1], act.nbytes)
                self._left[t.key] = len(parts)
        self._spans.sort(key=lambda s: s[0])
        self._thread = threading.Thread(target=self._run, name="ckpt-early-check", daemon=True)
        self._thread.start()

    def reached(self, offset: int, last: bool = False) -> None:
        """The writer's bytes are in the file up to ``offset``: hand over every tensor that ends before it
        (``last``: the writer is done, and every core compares the rest)."""
        spans = self._spans
        while self._next < len(spans) and spans[self._next][1] <= offset:
            span = spans[self._next]
            self._pending.append(span)
            self._pending_bytes += span[1] - span[0]
            self._next += 1
        if last:
            self._hand_over(workers=None)
        elif self._pending_bytes >= BATCH:
            self._hand_over()

    def _hand_over(self, workers: int | None = 1) -> None:
        if self._pending and self._thread is not None:
            self._queue.put((self._pending, workers))
        self._pending, self._pending_bytes = [], 0

    def _run(self) -> None:
        from .compare import compare_pairs

        try:
            for batch, workers in iter(self._queue.get, None):
                # a batch that differs somewhere (rare): each of its spans on its own, the equal ones counted
                same = batch if not compare_pairs([(t.key, t, act) for _, _, t, act, _ in batch],
                                                  workers=workers) else \
                    [span for span in batch if not compare_pairs([(span[2].key, span[2], span[3])], workers=1)]
                for *_, key in same:
                    self._left[key] -= 1
                    if not self._left[key]:  # every part of it equal: the whole tensor, where it lies
                        self.proven[key] = self._whole[key]
        except (CkptError, OSError):
            return  # nothing more is proven early: the final pass compares the rest and reports what fails
        except BaseException as exc:  # noqa: BLE001 - a bug: handed to the writer's thread by close()
            self._error = exc

    def close(self, finished: bool) -> Proven:
        """Wait for the thread (after comparing the rest when the writer ``finished``); what was proven."""
        if finished:
            self.reached(1 << 62, last=True)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        for source in self._sources:
            source.close()
        if self._error is not None:
            raise self._error
        return self.proven if finished else {}
