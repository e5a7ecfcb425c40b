"""Byte sources behind StorageRefs: where tensor data is read from, on demand.

Readers register storages here (a file region or bytes already in memory)
instead of reading them, so metadata paths never touch tensor bytes.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import InputError
from ..model import DataSource
from .bytesource import ByteSource, is_url, open_regular, pread_exact
from .paths import open_bytes

__all__ = ["ByteSource", "open_bytes", "open_regular", "pread_exact"]


class FileSource(DataSource):
    """Storages that are regions of one file, located lazily by a resolver.

    The resolver maps a storage key to (absolute offset, length); formats whose
    offsets cost I/O to find (zip local headers) pay only when data is read.
    """

    def __init__(
        self, path: str, resolve: Callable[[str], tuple[int, int]], on_close: Callable[[], None] | None = None
    ) -> None:
        self.path = path
        self._resolve = resolve
        self._on_close = on_close
        self._fd: int | None = None
        self._cache: dict[str, tuple[int, int]] = {}

    def region(self, key: str) -> tuple[int, int]:
        found = self._cache.get(key)
        if found is None:
            found = self._resolve(key)
            self._cache[key] = found
        return found

    def fd(self) -> int:
        if self._fd is None:
            self._fd = open_regular(self.path)
        return self._fd

    def read(self, key: str, offset: int, length: int) -> bytes:
        start, size = self.region(key)
        if offset < 0 or length < 0 or offset + length > size:
            raise InputError(
                f"storage {key!r} holds {size} bytes but a tensor needs bytes "
                f"{offset}..{offset + length}",
                self.path,
            )
        return pread_exact(self.fd(), length, start + offset, self.path)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        length = len(out)
        start, size = self.region(key)
        if offset < 0 or offset + length > size:
            raise InputError(
                f"storage {key!r} holds {size} bytes but a tensor needs bytes {offset}..{offset + length}", self.path
            )
        got = 0
        fd = self.fd()
        while got < length:
            n = os.preadv(fd, [out[got:]], start + offset + got)
            if n <= 0:
                raise InputError(
                    f"truncated: needed {length} bytes at offset {start + offset}, the file ends first", self.path
                )
            got += n

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._on_close is not None:
            self._on_close()


class RangeSource(DataSource):
    """Storages that are regions of a ByteSource that is not a local file (a URL).

    Not a FileSource: writers and verification take their plain-read paths
    (no descriptors, no kernel copies) for it.
    """

    def __init__(self, data: ByteSource, resolve: Callable[[str], tuple[int, int]]) -> None:
        self.path = data.name
        self.data = data
        self._resolve = resolve
        self._cache: dict[str, tuple[int, int]] = {}

    def region(self, key: str) -> tuple[int, int]:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._resolve(key)
        return found

    def _check(self, key: str, offset: int, length: int) -> int:
        start, size = self.region(key)
        if offset < 0 or length < 0 or offset + length > size:
            raise InputError(
                f"storage {key!r} holds {size} bytes but a tensor needs bytes {offset}..{offset + length}", self.path
            )
        return start + offset

    def read(self, key: str, offset: int, length: int) -> bytes:
        return self.data.read_data(self._check(key, offset, length), length)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.data.read_into(self._check(key, offset, len(out)), out)


def storage_source(path: str, resolve: Callable[[str], tuple[int, int]],
                   on_close: Callable[[], None] | None = None, data: ByteSource | None = None) -> DataSource:
    """Where a reader's storages are read from: a FileSource for a local file, else a RangeSource."""
    if is_url(path):
        return RangeSource(data if data is not None else open_bytes(path), resolve)
    return FileSource(path, resolve, on_close)


class BytesStorageSource(DataSource):
    """Storages that are regions of one bytes object (no file behind them)."""

    def __init__(self, path: str, blob: bytes, resolve: Callable[[str], tuple[int, int]]) -> None:
        self.path = path
        self._view = memoryview(blob)
        self._resolve = resolve

    def region(self, key: str) -> tuple[int, int]:
        return self._resolve(key)

    def read(self, key: str, offset: int, length: int) -> bytes:
        start, size = self._resolve(key)
        if offset < 0 or length < 0 or offset + length > size:
            raise InputError(
                f"storage {key!r} holds {size} bytes but a tensor needs bytes {offset}..{offset + length}",
                self.path,
            )
        return bytes(self._view[start + offset : start + offset + length])


class MemorySource(DataSource):
    """Storages already in memory (NumPy arrays inside a pickle, --unsafe loads)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.buffers: dict[str, bytes] = {}

    def add(self, data: bytes) -> str:
        key = str(len(self.buffers))
        self.buffers[key] = data
        return key

    def read(self, key: str, offset: int, length: int) -> bytes:
        data = self.buffers[key]
        if offset + length > len(data):
            raise InputError(f"storage {key!r} is shorter than its tensor", self.path)
        return bytes(data[offset : offset + length])


def read_pickle_file(path: str, limit: int, what: str) -> bytes:
    """A whole (pickle) file, refused before reading when it is over ``limit`` bytes."""
    from ..errors import LimitExceeded

    with open_bytes(path) as data:
        size = data.size
        if size > limit:
            raise LimitExceeded(
                f"{what} is {size} bytes, over the pickle limit of {limit} (raise it with --max-pickle-bytes)", path
            )
        return data.read(0, size)
