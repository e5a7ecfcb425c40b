"""The torch zip format (``torch.save``), written with the standard library.

Mirrors what ``torch.save`` writes: ``<archive>/data.pkl`` (pickle protocol
2), ``.format_version``, ``.storage_alignment``, ``byteorder``, one stored
(uncompressed) ``data/<key>`` record per storage whose bytes start on a
64-byte boundary (torch pads with an ``FB`` extra field, so ``torch.load(mmap=True)``
can map them), then ``version`` and ``.data/serialization_id``. CRCs are
real, so ``zipfile`` and ``unzip -t`` accept the file too; ZIP64 records are
written past 4 GiB.
"""
from __future__ import annotations

import io
import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ...errors import InputError
from ..base import OutTensor
from ..output import Output, copy_region
from ..sourcebytes import Region, out_bytes, storage_data
from .datapkl import StorageTable, TorchPickler

ALIGNMENT = 64
ZIP64_LIMIT = 0xFFFFFFFF  # sizes and offsets at or above this need ZIP64 records (tests lower it)
_MARK32 = 0xFFFFFFFF  # what a 32-bit field holds when the value is in a ZIP64 record
_MARK16 = 0xFFFF
_LOCAL = struct.Struct("<4s5H3L2H")
_CENTRAL = struct.Struct("<4s6H3L5H2L")
_FLAG_UTF8 = 0x800


@dataclass
class _Entry:
    name: bytes
    offset: int
    size: int
    crc: int


class ZipWriter:
    """Stored members written one after another to an open file descriptor."""

    def __init__(self, fd: int, prefix: str) -> None:
        self.out = Output(fd)
        self.prefix = prefix
        self.entries: list[_Entry] = []

    @property
    def pos(self) -> int:
        return self.out.pos

    def _header(self, name: bytes, size: int, crc: int) -> bytes:
        zip64 = size >= ZIP64_LIMIT
        extra = struct.pack("<HHQQ", 1, 16, size, size) if zip64 else b""
        start = self.out.pos + _LOCAL.size + len(name) + len(extra) + 4
        pad = -start % ALIGNMENT
        extra += b"FB" + struct.pack("<H", pad) + b"Z" * pad
        stored = _MARK32 if zip64 else size
        return _LOCAL.pack(b"PK\x03\x04", 45 if zip64 else 20, _FLAG_UTF8, 0, 0, 0, crc, stored, stored,
                           len(name), len(extra)) + name + extra

    def add(self, name: str, data: bytes) -> None:
        self.add_stream(name, len(data), (data,))

    def add_stream(self, name: str, size: int, pieces: Iterable[bytes | bytearray] | Region,
                   on_bytes: Callable[[int], None] | None = None) -> None:
        """A member of known ``size``; a one-piece member gets its CRC up front, others have it patched in."""
        raw_name = f"{self.prefix}/{name}".encode()
        offset = self.out.pos
        if isinstance(pieces, Region):
            if pieces.length != size:
                raise InputError(f"{name}: expected {size} bytes but the source holds {pieces.length}")
            self.out.write(self._header(raw_name, size, 0))
            crc = copy_region(self.out, pieces, crc=True, on_bytes=on_bytes)
            os.pwrite(self.out.fd, struct.pack("<I", crc), offset + 14)
            self.entries.append(_Entry(raw_name, offset, size, crc))
            return
        if isinstance(pieces, tuple):
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            if len(data) != size:
                raise InputError(f"{name}: expected {size} bytes but the source gave {len(data)} (did it change?)")
            crc = zlib.crc32(data)
            self.out.write(self._header(raw_name, size, crc))
            self.out.write(data)
        else:
            self.out.write(self._header(raw_name, size, 0))
            crc = 0
            written = 0
            for chunk in pieces:
                crc = zlib.crc32(chunk, crc)
                self.out.write(chunk)
                written += len(chunk)
            if written != size:
                raise InputError(f"{name}: expected {size} bytes but the source gave {written} (did it change?)")
            self.out.flush()
            os.pwrite(self.out.fd, struct.pack("<I", crc), offset + 14)
        if on_bytes is not None:
            on_bytes(size)
        self.entries.append(_Entry(raw_name, offset, size, crc))

    def close(self) -> None:
        """The central directory and end records (ZIP64 ones when needed)."""
        cd_start = self.pos
        parts = []
        for e in self.entries:
            fields = []
            size = e.size
            offset = e.offset
            if e.size >= ZIP64_LIMIT:
                fields += [e.size, e.size]
                size = _MARK32
            if e.offset >= ZIP64_LIMIT:
                fields.append(e.offset)
                offset = _MARK32
            extra = struct.pack("<HH", 1, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields) if fields else b""
            version = 45 if fields else 20
            parts.append(_CENTRAL.pack(b"PK\x01\x02", version, version, _FLAG_UTF8, 0, 0, 0, e.crc, size, size,
                                       len(e.name), len(extra), 0, 0, 0, 0, offset) + e.name + extra)
        directory = b"".join(parts)
        self.out.write(directory)
        count = len(self.entries)
        cd_size = len(directory)
        tail = b""
        if count >= min(_MARK16, ZIP64_LIMIT) or cd_size >= ZIP64_LIMIT or cd_start >= ZIP64_LIMIT:
            rec_at = self.pos
            tail += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_start)
            tail += struct.pack("<4sLQL", b"PK\x06\x07", 0, rec_at, 1)
            tail += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, _MARK16, _MARK16, _MARK32, _MARK32, 0)
        else:
            tail += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, cd_size, cd_start, 0)
        self.out.write(tail)
        self.out.flush()


def archive_name(final_path: str) -> str:
    """The folder inside the archive: the output's file name without extension, as torch.save does."""
    stem = os.path.splitext(os.path.basename(final_path))[0]
    return stem if stem and "/" not in stem and "\\" not in stem else "archive"


def pickle_root(root: Any) -> tuple[bytes, StorageTable]:
    """``data.pkl`` for ``root`` and the storages it names (raises before anything is written)."""
    table = StorageTable()
    buf = io.BytesIO()
    try:
        TorchPickler(buf, table).dump(root)
    except RecursionError:
        raise InputError("the metadata is nested too deeply to write back into a torch file; pass "
                         "--state-dict-only to write the weights alone, or write a .safetensors") from None
    return buf.getvalue(), table


def _unreferenced(cast: OutTensor | None) -> tuple[bytes]:
    """The bytes of a storage that no source region holds: a cast tensor's new values, or none."""
    return (out_bytes(cast),) if cast is not None else (b"",)


def write_torch_zip(fd: int, final_path: str, data_pkl: bytes, table: StorageTable,
                    on_bytes: Callable[[int], None] | None = None) -> int:
    """Write the archive to ``fd``; returns the number of bytes written."""
    z = ZipWriter(fd, archive_name(final_path))
    z.add("data.pkl", data_pkl)
    z.add(".format_version", b"1")
    z.add(".storage_alignment", str(ALIGNMENT).encode())
    z.add("byteorder", sys.byteorder.encode())
    copies = storage_data([st.ref for st in table.storages if st.ref is not None], regions=True)
    for st in table.storages:
        data = next(copies) if st.ref is not None else _unreferenced(st.cast)
        z.add_stream(f"data/{st.key}", st.nbytes, data, on_bytes)
    z.add("version", b"3\n")
    import secrets  # here: 6 ms of hmac and OpenSSL that readers of torch zips never need

    z.add(".data/serialization_id", f"{secrets.randbelow(10 ** 40):040d}".encode())
    z.close()
    return z.pos
