"""A file behind a URL read by byte ranges: a few requests for metadata, parallel ranges for data.

``RemoteFile(url)`` makes one request, for the first 64 KiB: it learns the
size and ETag from the response and keeps the block, which holds a
safetensors header, a torch zip's ``data.pkl`` or a DCP ``.metadata`` in
most files. Later small reads are served from the blocks already fetched
or fetch at least 64 KiB; reads of tensor data are split into parts fetched
in parallel, and sequential reads fetch the next parts ahead. Every
response's size and ETag must match the first (and ``If-Match`` asks the
server to refuse a changed file), so a file replaced between two requests
is an error, never a mix of two files.

Every request in flight is tracked: ``release()`` (the end of the session
that opened the file) cancels those not started and waits for the others,
and a released file fetches nothing ahead, so no request outlives the
command that made it.
"""
from __future__ import annotations

import contextvars
import os
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from ..bytesource import ByteSource, LocalFile
from .fetchers import Fetched, FetchError
from .session import RemoteError, Session, error_for

HEAD_BLOCK = 64 << 10  # the first request: a safetensors header or torch data.pkl fits in most files
MIN_FETCH = 64 << 10  # small reads fetch at least this much (neighbouring reads then cost nothing)
MAX_AHEAD = 4 << 20  # the most a forward-walking metadata reader fetches at once
SMALL_DATA = 1 << 20  # tensor reads below this go through the block cache
PART = 8 << 20  # large reads are split into parts of this size, fetched in parallel
WORKERS = 8  # parallel requests per process
AHEAD = 2  # parts fetched ahead of a reader moving forward
CACHE_BUDGET = 64 << 20  # bytes of metadata blocks kept per file

class _Shared:
    """The process's pool of range requests, made on first use; a forked child starts afresh."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None

    def reset(self) -> None:
        """After a fork: the parent's pool threads and a lock they may have held do not exist here."""
        self.lock = threading.Lock()
        self.pool = None


_SHARED = _Shared()


_LIVE: weakref.WeakSet[RemoteFile] = weakref.WeakSet()


def _pool() -> ThreadPoolExecutor:
    """Leaf tasks only (one range request each), so the pool can never wait on itself."""
    with _SHARED.lock:
        if _SHARED.pool is None:
            _SHARED.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="ckpt-range")
        return _SHARED.pool


def _after_fork() -> None:
    """A forked worker (migrate --workers) has none of the parent's threads: a pool of its own, free
    locks, and no futures of requests the parent's threads would have completed."""
    _SHARED.reset()
    for f in list(_LIVE):
        f._lock, f._miss_lock, f._flight_lock = threading.Lock(), threading.Lock(), threading.Lock()
        f._parts.clear()
        f._inflight.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class RemoteFile(ByteSource):
    """A file behind a URL, read by range requests (or, after --download, from a local copy)."""

    remote = True

    def __init__(self, url: str, fetcher: Any, sess: Session) -> None:
        self.name = url
        self._fetcher = fetcher
        self._session = sess
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._miss_lock = threading.Lock()
        self._parts: OrderedDict[int, Future[bytes]] = OrderedDict()  # data parts, fetched or in flight
        self._inflight: set[Future[bytes]] = set()  # every request submitted and not finished
        self._flight_lock = threading.Lock()
        self._released = False  # the session is over: nothing more is fetched ahead
        self._seq_end = -1  # where the last metadata fetch ended
        self._ahead = MIN_FETCH
        self._local: LocalFile | None = None
        self.etag: str | None = None
        _LIVE.add(self)
        try:
            first = fetcher.fetch(0, HEAD_BLOCK, None)
        except FetchError as exc:
            if exc.kind == "range-ignored" and sess.download:
                self._download()
                return
            raise
        self._session.count(first.requests, len(first.data))
        if first.size is None:
            raise RemoteError("the server does not say how large the file is (no Content-Range)", url)
        self.size = first.size
        self.etag = first.etag
        if len(first.data) != min(HEAD_BLOCK, self.size):
            raise RemoteError(f"the server sent {len(first.data)} bytes for a range of "
                              f"{min(HEAD_BLOCK, self.size)}", url)
        self._keep(0, first.data)

    # -- requests ------------------------------------------------------------------
    def _fetch(self, start: int, end: int) -> bytes:
        """Exactly bytes [start, end) in one request, checked against the size and ETag first seen."""
        try:
            got: Fetched = self._fetcher.fetch(start, end, self.etag)
        except FetchError as exc:
            self._session.count(1, 0)
            raise error_for(exc, self.name) from None
        self._session.count(got.requests, len(got.data))
        if got.size is not None and got.size != self.size:
            raise error_for(FetchError("changed", f"its size went from {self.size} to {got.size} bytes"), self.name)
        if got.etag and self.etag and got.etag != self.etag:
            raise error_for(FetchError("changed", f"its ETag went from {self.etag} to {got.etag}"), self.name)
        if len(got.data) != end - start:
            raise RemoteError(f"truncated: needed {end - start} bytes at offset {start}, the server sent "
                              f"{len(got.data)}", self.name)
        return got.data

    def _download(self) -> None:
        """--download: the whole file into an unlinked temporary file, read locally from then on.

        The file is unlinked before the first byte is written: nothing is left behind, even
        when ckpt is killed mid-download.
        """
        fd, path = tempfile.mkstemp(prefix="ckpt-download-")
        os.unlink(path)
        try:
            with os.fdopen(os.dup(fd), "wb") as out:
                total = self._fetcher.download(out, lambda n: self._session.count(0, n))
            self._session.count(1, 0)
        except FetchError as exc:
            os.close(fd)
            raise error_for(exc, self.name) from None
        except BaseException:
            os.close(fd)
            raise
        self._local = LocalFile.from_fd(fd, self.name)
        self.size = total

    # -- the metadata cache --------------------------------------------------------
    def _keep(self, start: int, data: bytes) -> None:
        with self._lock:
            old = self._blocks.pop(start, None)
            if old is not None:
                self._cached -= len(old)
                if len(old) > len(data):
                    data = old
            self._blocks[start] = data
            self._cached += len(data)
            while self._cached > CACHE_BUDGET and len(self._blocks) > 1:
                _, old = self._blocks.popitem(last=False)
                self._cached -= len(old)

    def _from_cache(self, offset: int, n: int) -> bytes | None:
        with self._lock:
            for start, data in reversed(self._blocks.items()):  # the latest blocks first
                if start <= offset and offset + n <= start + len(data):
                    return data[offset - start : offset - start + n]
        return None

    def _cached_head(self, offset: int) -> bytes:
        """The cached bytes from ``offset`` to the end of a block that holds it (b"" if none does)."""
        with self._lock:
            for start, data in reversed(self._blocks.items()):
                if start <= offset < start + len(data):
                    return data[offset - start :]
        return b""

    def _read_cached(self, offset: int, n: int, limit: int) -> bytes:
        """Bytes through the block cache: a miss fetches what is not cached, at least 64 KiB, and
        more each time a reader keeps walking forward (up to ``limit``)."""
        found = self._from_cache(offset, n)
        if found is not None:
            return found
        with self._miss_lock:  # one miss at a time: a second reader of the same bytes finds them cached
            found = self._from_cache(offset, n)
            if found is not None:
                return found
            head = self._cached_head(offset)
            while head and len(head) < n:  # the bytes may span several cached blocks
                more = self._cached_head(offset + len(head))
                if not more:
                    break
                head += more
            if len(head) >= n:
                return head[:n]
            start = offset + len(head)
            with self._lock:
                forward = self._seq_end - MIN_FETCH <= start <= self._seq_end + MIN_FETCH
                self._ahead = min(self._ahead * 2, limit) if forward else MIN_FETCH
                end = min(self.size, start + max(n - len(head), self._ahead))
                self._seq_end = end
            data = self._fetch(start, end)
            if len(data) <= CACHE_BUDGET // 4:
                self._keep(start, data)
        rest = n - len(head)
        return head + data[:rest] if head else (data if len(data) == n else data[:n])

    # -- ByteSource ----------------------------------------------------------------
    def read(self, offset: int, n: int) -> bytes:
        """Metadata: one request however large (a big data.pkl is one more request, not many)."""
        if self._local is not None:
            return self._local.read(offset, n)
        if offset < 0 or n < 0 or offset + n > self.size:
            raise RemoteError(f"truncated: needed {n} bytes at offset {offset}, the file ends first", self.name)
        return self._read_cached(offset, n, MAX_AHEAD) if n else b""

    def read_some(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``, fewer when a cached block ends first (stream readers)."""
        if self._local is None and 0 <= offset < self.size:
            head = self._cached_head(offset)
            if head:
                return head[:n]
        return self.read_upto(offset, n)

    def read_data(self, offset: int, n: int) -> bytes:
        """Tensor bytes: small ones through the cache (neighbours share requests), large ones in parts."""
        if self._local is not None:
            return self._local.read(offset, n)
        if offset < 0 or n < 0 or offset + n > self.size:
            raise RemoteError(f"truncated: needed {n} bytes at offset {offset}, the file ends first", self.name)
        if n < SMALL_DATA:
            return self._read_cached(offset, n, PART) if n else b""
        return self._data(offset, n)

    def read_into(self, offset: int, out: memoryview) -> None:
        if self._local is not None:
            self._local.read_into(offset, out)
            return
        out[:] = self.read_data(offset, len(out))

    def _data(self, offset: int, n: int) -> bytes:
        """Tensor bytes from aligned 8 MiB parts, fetched in parallel and shared by every reader;
        a reader moving forward has the next parts fetched ahead (each part is fetched once)."""
        first, last = offset // PART, (offset + n - 1) // PART
        wanted = [self._part(i) for i in range(first, last + 1)]
        with self._lock:
            forward = (first - 1 in self._parts or first == 0) and not self._released
        if forward:
            for i in range(last + 1, min(last + 1 + AHEAD, (self.size - 1) // PART + 1)):
                self._part(i)
        pieces = []
        try:
            for i, future in zip(range(first, last + 1), wanted, strict=True):
                block = future.result()
                lo = max(offset, i * PART) - i * PART
                hi = min(offset + n, (i + 1) * PART) - i * PART
                pieces.append(block if lo == 0 and hi == len(block) else block[lo:hi])
        except BaseException:
            for future in wanted:  # the read failed: the parts not started yet are not wanted any more
                future.cancel()
            raise
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _submit(self, start: int, end: int) -> Future[bytes]:
        """One range request on the pool, tracked until it is done (release() waits for it)."""
        future = _pool().submit(contextvars.copy_context().run, self._fetch, start, end)
        with self._flight_lock:
            self._inflight.add(future)
        future.add_done_callback(self._done)  # after the add: a request already done is discarded at once
        return future

    def _done(self, future: Future[bytes]) -> None:
        with self._flight_lock:
            self._inflight.discard(future)

    def _part(self, index: int) -> Future[bytes]:
        """The future of part ``index`` (bytes [index * PART, (index + 1) * PART)), started once."""
        with self._lock:
            future = self._parts.get(index)
            if future is None:
                start = index * PART
                future = self._submit(start, min(self.size, start + PART))
                self._parts[index] = future
                while len(self._parts) > WORKERS + AHEAD:  # memory stays bounded: forget the oldest parts
                    self._parts.popitem(last=False)  # (release() still ends them: they are in _inflight)
            else:
                self._parts.move_to_end(index)
        return future

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch many small ranges (legacy storage counts) concurrently, neighbours merged."""
        if self._local is not None or not ranges:
            return
        spans: list[list[int]] = []
        for off, n in sorted(ranges):
            if off < 0 or off + n > self.size or self._from_cache(off, n) is not None:
                continue
            if spans and off - spans[-1][1] < MIN_FETCH:
                spans[-1][1] = max(spans[-1][1], off + n)
            else:
                spans.append([off, off + n])
        futures = [(s, self._submit(s, e)) for s, e in spans]
        _done, pending = wait([f for _, f in futures], return_when=FIRST_EXCEPTION)
        for future in pending:  # one failed: the rest are not wanted (those already running finish)
            future.cancel()
        wait(pending)
        for start, future in futures:
            self._keep(start, future.result())

    def close(self) -> None:
        """Nothing to release between readers: the session keeps the blocks until it ends."""

    def release(self) -> None:
        """The session is over: drop the cached blocks and the parts, and end every request in flight
        (those not started are cancelled, the others waited for), so none is made after the command
        returns. Reads after this still work, without read-ahead (a Checkpoint read after its session)."""
        with self._lock:
            self._released = True
            self._blocks.clear()
            self._cached = 0
            self._parts.clear()
        with self._flight_lock:
            pending = list(self._inflight)
        for future in pending:
            future.cancel()
        wait(pending)
