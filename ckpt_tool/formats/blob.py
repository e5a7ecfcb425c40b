"""torch.save bytes held in memory: nested inside a pickle, or one DCP chunk.

``pickle.dump(tensor)`` writes each storage as ``torch.storage._load_from_bytes(b)``
where ``b`` is a whole (legacy-format) torch.save blob, and every tensor chunk
of a torch.distributed.checkpoint shard is a torch.save zip. Both are parsed
here with the same restricted readers as files on disk (never torch.load).
"""
from __future__ import annotations

import io
import struct
import zipfile
from typing import Any, Callable, NamedTuple

from ..errors import InputError, LimitExceeded
from ..limits import Limits
from ..model import DataSource, GlobalRef
from ..pickles.unpickler import restricted_loads

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # 30 bytes


class BlobSource(DataSource):
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


class _MemberInfo(NamedTuple):
    name: str
    size: int
    method: int
    header_offset: int
    compressed_size: int


class MemoryZip:
    """The few ZipArchive methods torch-zip parsing needs, over bytes in memory.

    Blobs here hold one tensor or a handful, so the standard zipfile module's
    per-entry cost does not matter; offsets are still checked before use.
    """

    def __init__(self, blob: bytes, path: str, where: str) -> None:
        self.path = path
        self.where = where
        self.blob = blob
        try:
            zf = zipfile.ZipFile(io.BytesIO(blob))
            infos = zf.infolist()
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
            # NotImplementedError: zipfile refuses records that claim a newer zip version
            raise InputError(f"{where} is not a readable zip archive: {exc}", path) from None
        self.members: dict[str, _MemberInfo] = {}
        self.duplicates: list[str] = []
        for info in infos:
            if info.filename in self.members:
                self.duplicates.append(info.filename)
            self.members[info.filename] = _MemberInfo(
                info.filename, info.file_size, info.compress_type, info.header_offset, info.compress_size
            )
        self._zf = zf

    def names(self) -> list[str]:
        return list(self.members)

    def region(self, name: str) -> tuple[int, int]:
        m = self.members.get(name)
        if m is None:
            raise InputError(f"{self.where}: archive member {name!r} is missing", self.path)
        if m.method != zipfile.ZIP_STORED:
            raise InputError(f"{self.where}: archive member {name!r} is compressed", self.path)
        head = self.blob[m.header_offset : m.header_offset + 30]
        if len(head) < 30 or head[:4] != b"PK\x03\x04":
            raise InputError(f"{self.where}: bad local header for {name!r}", self.path)
        nlen, xlen = _LOCAL_HEADER.unpack(head)[9:11]
        start = m.header_offset + 30 + nlen + xlen
        if start + m.size > len(self.blob):
            raise InputError(f"{self.where}: archive member {name!r} is cut short", self.path)
        return start, m.size

    def read(self, name: str, limit: int = 1 << 31) -> bytes:
        m = self.members.get(name)
        if m is None:
            raise InputError(f"{self.where}: archive member {name!r} is missing", self.path)
        if m.size > limit:
            raise LimitExceeded(f"{self.where}: archive member {name!r} is over the limit of {limit} bytes "
                                "(raise it with --max-pickle-bytes)",
                                self.path)
        if m.method == zipfile.ZIP_STORED:
            start, size = self.region(name)
            return self.blob[start : start + size]
        try:
            return self._zf.read(name)
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
            raise InputError(f"{self.where}: archive member {name!r} is corrupt: {exc}", self.path) from None

    def close(self) -> None:
        """Nothing to release: the bytes belong to the caller."""


def read_torch_blob(blob: bytes, *, path: str, where: str, limits: Limits) -> tuple[Any, list[GlobalRef]]:
    """(object, globals it names) for torch.save bytes, zip or legacy, read lazily."""
    if blob.startswith(b"PK\x03\x04"):
        return _read_zip_blob(blob, path, where, limits)
    from .legacy import parse_legacy_bytes

    parsed = parse_legacy_bytes(blob, path=path, where=where, limits=limits, read_blob=read_torch_blob)
    return parsed.root, parsed.references


def _read_zip_blob(blob: bytes, path: str, where: str, limits: Limits) -> tuple[Any, list[GlobalRef]]:
    from .torchzip import archive_prefix, storage_loader

    archive = MemoryZip(blob, path, where)
    prefix = archive_prefix(archive)  # type: ignore[arg-type]  # duck-typed ZipArchive
    pkl = f"{prefix}/data.pkl" if prefix else "data.pkl"
    if pkl not in archive.members:
        raise InputError(f"{where} is a zip archive without {pkl!r}, not torch.save bytes", path)
    source = BlobSource(path, blob, archive.region)
    data = archive.read(pkl, limits.max_pickle_bytes)
    result = restricted_loads(
        data, where=f"{where}/{pkl}", path=path,
        persistent_load=storage_loader(archive, prefix, source, path),  # type: ignore[arg-type]
        limits=limits, read_blob=read_torch_blob,
    )
    return result.obj, list(result.references)
