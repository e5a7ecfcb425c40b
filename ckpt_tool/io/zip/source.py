"""The storages of a torch zip as a DataSource: plain regions of the file, or inflated members.

torch.save stores every storage, so reading a tensor is reading a region of
the file (or URL); an archive with deflated members (torch reads them too)
gets a source that inflates such a member on its first read.
"""
from __future__ import annotations

from abc import abstractmethod

from ...errors import InputError
from ...model import DataSource
from ..bytesource import ByteSource
from ..source import FileSource, RangeSource
from .archive import ZipArchive


class _DeflatedMembers(DataSource):
    """Storages that are members of a zip: stored ones read in place, deflated ones inflated when read.

    torch writes storages stored, and reads deflated ones too (miniz inflates
    them), so ckpt does: such a member is inflated once, on its first read,
    and only that member is held in memory.
    """

    archive: ZipArchive
    path: str
    _inflated: tuple[str, bytes] | None = None

    def _deflated(self, key: str) -> bytes | None:
        m = self.archive.members.get(key)
        if m is None or m.method == 0:
            return None
        if self._inflated is None or self._inflated[0] != key:
            self._inflated = (key, self.archive.read(key, self.archive.member_limit, "--max-member-bytes"))
        return self._inflated[1]

    @abstractmethod
    def _read_stored(self, key: str, offset: int, length: int) -> bytes:
        """A stored member's bytes, read in place by the source class the archive lives in."""

    def read(self, key: str, offset: int, length: int) -> bytes:
        data = self._deflated(key)
        if data is None:
            return self._read_stored(key, offset, length)
        if offset < 0 or length < 0 or offset + length > len(data):
            raise InputError(f"storage {key!r} holds {len(data)} bytes but a tensor needs bytes "
                             f"{offset}..{offset + length}", self.path)
        return data[offset : offset + length]

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        if self._deflated(key) is None:
            super().read_into(key, offset, out)
        else:
            out[:] = self.read(key, offset, len(out))


class ZipSource(_DeflatedMembers, FileSource):
    """The storages of a zip file on disk."""

    def __init__(self, archive: ZipArchive) -> None:
        FileSource.__init__(self, archive.path, self._stored_region, archive.close)
        self.archive = archive

    def _stored_region(self, key: str) -> tuple[int, int]:
        return self.archive.region(key)

    def _read_stored(self, key: str, offset: int, length: int) -> bytes:
        return FileSource.read(self, key, offset, length)


class RemoteZipSource(_DeflatedMembers, RangeSource):
    """The storages of a zip behind a URL."""

    def __init__(self, archive: ZipArchive, data: ByteSource) -> None:
        RangeSource.__init__(self, data, archive.region)
        self.archive = archive

    def _read_stored(self, key: str, offset: int, length: int) -> bytes:
        return RangeSource.read(self, key, offset, length)


def zip_source(archive: ZipArchive) -> DataSource:
    """Where an archive's storages are read from: plain regions of the file (or URL) when every member
    is stored, as torch.save writes them; the inflating sources only for an archive with deflated ones."""
    if archive.source is not None and archive.source.remote:
        if archive.compressed:
            return RemoteZipSource(archive, archive.source)
        return RangeSource(archive.source, archive.region)
    return ZipSource(archive) if archive.compressed else FileSource(archive.path, archive.region, archive.close)
