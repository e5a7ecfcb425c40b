"""The storages of a torch zip as a DataSource: plain regions of the file, or inflated members.

torch.save stores every storage, so reading a tensor is reading a region of
the file (or URL); an archive with deflated members (torch reads them too)
gets a source that inflates such a member on its first read.
"""
from __future__ import annotations

from ...errors import InputError
from ...model import DataSource
from ..bytesource import ByteSource
from ..source import FileSource, RangeSource
from .archive import ZipArchive


class _DeflatedMembers:
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

    def read(self, key: str, offset: int, length: int) -> bytes:
        data = self._deflated(key)
        if data is None:
            return super().read(key, offset, length)  # type: ignore[misc]
        if offset < 0 or length < 0 or offset + length > len(data):
            raise InputError(f"storage {key!r} holds {len(data)} bytes but a tensor needs bytes "
                             f"{offset}..{offset + length}", self.path)
        return data[offset : offset + length]

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        if self._deflated(key) is None:
            super().read_into(key, offset, out)  # type: ignore[misc]
        else:
            out[:] = self.read(key, offset, len(out))


class ZipSource(_DeflatedMembers, FileSource):
    """The storages of a zip file on disk."""

    def __init__(self, archive: ZipArchive) -> None:
        FileSource.__init__(self, archive.path, self._stored_region, archive.close)
        self.archive = archive

    def _stored_region(self, key: str) -> tuple[int, int]:
        return self.archive.region(key)


class RemoteZipSource(_DeflatedMembers, RangeSource):
    """The storages of a zip behind a URL."""

    def __init__(self, archive: ZipArchive, data: ByteSource) -> None:
        RangeSource.__init__(self, data, archive.region)
        self.archive = archive


def zip_source(archive: ZipArchive) -> DataSource:
    """Where an archive's storages are read from: plain regions of the file (or URL) when every member
    is stored, as torch.save writes them; the inflating sources only for an archive with deflated ones."""
    if archive.source is not None and archive.source.remote:
        if archive.compressed:
            return RemoteZipSource(archive, archive.source)
        return RangeSource(archive.source, archive.region)
    return ZipSource(archive) if archive.compressed else FileSource(archive.path, archive.region, archive.close)
