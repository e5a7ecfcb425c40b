"""One way to read bytes, wherever they live: a local file or a URL.

Every reader asks a ByteSource for ranges (``read(offset, n)``) instead of
opening a file and calling pread, so the same readers serve ``s3://``,
``https://`` and ``hf://`` paths (io/remote/session.py) with a few range requests.
"""
from __future__ import annotations

import os
import re
import stat
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from ..errors import InputError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike[str]) -> bool:
    """A path with a protocol (``https://``, ``s3://``, ``hf://``, any fsspec protocol)."""
    return isinstance(path, str) and _URL.match(path) is not None


def open_regular(path: str) -> int:
    """Open a regular file read-only; refuse FIFOs and devices that would hang."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a FIFO, socket or device would hang the reader)", path)
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path) from None


_CHECK_ABOVE = 1 << 20  # bytes; smaller reads cannot allocate much


def pread_exact(fd: int, length: int, offset: int, path: str) -> bytes:
    """Read exactly ``length`` bytes at ``offset`` or fail with a truncation error.

    A large ``length`` is checked against the file's size first: os.pread
    allocates the whole length before reading, and lengths come from the file.
    """
    if length > _CHECK_ABOVE and offset + length > os.fstat(fd).st_size:
        raise InputError(f"truncated: needed {length} bytes at offset {offset}, the file ends first", path)
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        chunk = os.pread(fd, length - got, offset + got)
        if not chunk:
            raise InputError(
                f"truncated: needed {length} bytes at offset {offset}, the file ends first", path
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class ByteSource(ABC):
    """The bytes of one file, read by range. ``size`` is known once it is open."""

    name: str
    size: int
    remote = False

    @abstractmethod
    def read(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``offset``, or an InputError saying the file ends first."""

    def read_into(self, offset: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes at ``offset`` (streaming readers reuse one buffer)."""
        out[:] = self.read(offset, len(out))

    def read_upto(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``: fewer at the end of the file, none past it."""
        n = min(n, self.size - offset)
        return self.read(offset, n) if n > 0 and offset >= 0 else b""

    def read_some(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``offset``, at least one unless at the end (stream readers)."""
        return self.read_upto(offset, n)

    def read_data(self, offset: int, n: int) -> bytes:
        """Tensor bytes: like read, but a remote source fetches a large range in parallel parts."""
        return self.read(offset, n)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:  # noqa: B027 - a no-op hint unless overridden
        """A hint: (offset, length) ranges about to be read. Remote sources fetch them together."""

    def close(self) -> None:  # noqa: B027 - a source that holds nothing has nothing to release
        """Release what the source holds; reading again reopens it."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalFile(ByteSource):
    """A regular local file, read with pread (FIFOs and devices refused before opening)."""

    def __init__(self, path: str) -> None:
        self.name = path
        self._fd: int | None = open_regular(path)
        self.size = os.fstat(self._fd).st_size

    @classmethod
    def from_fd(cls, fd: int, name: str) -> LocalFile:
        """A file already open (an unlinked temporary): it cannot be reopened, so it is closed
        only when the object goes away."""
        self = cls.__new__(cls)
        self.name = name
        self._fd = fd
        self.size = os.fstat(fd).st_size
        self._keep_open = True
        return self

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = open_regular(self.name)
        return self._fd

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise InputError(f"truncated: needed {n} bytes at offset {offset}, the file ends first", self.name)
        return pread_exact(self.fd, n, offset, self.name)

    def read_into(self, offset: int, out: memoryview) -> None:
        got, length, fd = 0, len(out), self.fd
        while got < length:
            n = os.preadv(fd, [out[got:]], offset + got)
            if n <= 0:
                raise InputError(f"truncated: needed {length} bytes at offset {offset}, the file ends first",
                                 self.name)
            got += n

    _keep_open = False

    def close(self) -> None:
        if self._fd is not None and not self._keep_open:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self._keep_open = False
            self.close()
        except (OSError, AttributeError):  # interpreter teardown, or a failed __init__
            pass
