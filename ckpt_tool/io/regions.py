"""Byte ranges the scanner reads: a whole file, a region of one, or bytes in memory.

Members of an archive and payloads embedded in a pickle are regions of the
file they live in, so scanning a checkpoint never loads its storages.
"""
from __future__ import annotations

import io
import os
from typing import BinaryIO

from ..errors import InputError
from .bytesource import ByteSource

IN_MEMORY = 64 << 20  # regions up to this size are read whole: BytesIO walks fastest


class _Region(io.RawIOBase):
    """A read-only, seekable window onto a file descriptor or a ByteSource."""

    def __init__(self, fd: int | None, start: int, length: int, src: ByteSource | None = None) -> None:
        super().__init__()
        self._fd = fd
        self._src = src
        self._start = start
        self._length = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self._length - self._pos)
        if n <= 0:
            return 0
        if self._src is not None:
            data = self._src.read_some(self._start + self._pos, n)
        else:
            data = os.pread(self._fd, n, self._start + self._pos)  # type: ignore[arg-type]
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def window(src: ByteSource, start: int, length: int) -> io.RawIOBase:
    """A read-only, seekable stream over ``length`` bytes of ``src`` from ``start``, read by range on demand."""
    return _Region(None, start, length, src)


class Blob:
    """``length`` bytes starting at ``start`` of a file descriptor or a bytes object."""

    __slots__ = ("data", "fd", "length", "src", "start")

    def __init__(self, fd: int | None, data: bytes | None, start: int, length: int,
                 src: ByteSource | None = None) -> None:
        self.fd = fd
        self.data = data
        self.start = start
        self.length = max(0, length)
        self.src = src  # a file or URL read by range (fd and data are None then)

    @classmethod
    def from_fd(cls, fd: int, size: int) -> Blob:
        return cls(fd, None, 0, size)

    @classmethod
    def from_source(cls, src: ByteSource) -> Blob:
        return cls(None, None, 0, src.size, src)

    @classmethod
    def from_bytes(cls, data: bytes) -> Blob:
        return cls(None, bytes(data), 0, len(data))

    def read(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer at the end of the blob)."""
        if offset < 0 or offset >= self.length or n <= 0:
            return b""
        n = min(n, self.length - offset)
        if self.data is not None:
            return self.data[self.start + offset : self.start + offset + n]
        if self.src is not None:
            return self.src.read_upto(self.start + offset, n)
        assert self.fd is not None
        out = bytearray()
        while len(out) < n:
            chunk = os.pread(self.fd, n - len(out), self.start + offset + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def sub(self, offset: int, length: int) -> Blob:
        offset = min(max(0, offset), self.length)
        length = min(max(0, length), self.length - offset)
        return Blob(self.fd, self.data, self.start + offset, length, self.src)

    def stream(self) -> BinaryIO:
        """A seekable stream over the blob whose ``tell()`` counts from the blob's start."""
        if self.data is not None:
            if self.start == 0 and self.length == len(self.data):
                return io.BytesIO(self.data)
            return io.BytesIO(self.data[self.start : self.start + self.length])
        if self.length <= IN_MEMORY and (self.src is None or not self.src.remote):
            return io.BytesIO(self.read(0, self.length))
        return io.BufferedReader(_Region(self.fd, self.start, self.length, self.src),
                                 buffer_size=(1 << 16) if self.src is not None and self.src.remote else (1 << 20))


class BlobSource(ByteSource):
    """A Blob read as a ByteSource, for readers built on sources (the zip reader, over a member or a region)."""

    def __init__(self, blob: Blob, name: str = "") -> None:
        self.blob = blob
        self.name = name
        self.size = blob.length
        self.remote = blob.src is not None and blob.src.remote

    def read(self, offset: int, n: int) -> bytes:
        data = self.blob.read(offset, n)
        if len(data) != n or offset < 0:
            raise InputError(f"truncated: needed {n} bytes at offset {offset}, the data ends first", self.name or None)
        return data
