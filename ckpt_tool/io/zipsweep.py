"""Zip archives for the scanner: every entry the central directory lists, or every local header.

Lenient where torch is lenient (CRCs and local-header names are not checked,
a prefix before the archive is allowed, as zipfile allows it), and when the
central directory is broken, the local file headers are swept instead, so a
payload is found in any archive some reader might still open.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InputError, LimitExceeded
from .blob import Blob
from .ziparchive import inflate, local_header_size
from .ziparchive import zip64_extra as _zip64_extra

_EOCD = b"PK\x05\x06"
_EOCD64_LOC = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_CENTRAL_FMT = struct.Struct("<4s6H3L5H2L")  # 46 bytes
_LOCAL_FMT = struct.Struct("<4s5H3L2H")  # 30 bytes
MAX_SWEPT = 1_000_000
MAX_DIRECTORY = 1 << 30  # 200k storages take ~15 MB of central directory
_CHUNK = 1 << 20  # compressed bytes inflated at a time


class CorruptZip(Exception):
    """The end-of-archive record exists but the central directory cannot be read."""


@dataclass(frozen=True)
class Entry:
    name: str
    header_offset: int  # of the local header, within the blob
    compressed_size: int
    size: int
    method: int
    swept: bool = False  # found by sweeping local headers: sizes may be unknown


def read_directory(blob: Blob) -> list[Entry] | None:
    """Entries of the central directory; None without an end-of-archive record."""
    length = blob.length
    tail_len = min(length, 65536 + 22)
    tail = blob.read(length - tail_len, tail_len)
    pos = tail.rfind(_EOCD)
    while pos >= 0 and len(tail) - pos < 22:
        pos = tail.rfind(_EOCD, 0, pos)
    if pos < 0:
        return None
    eocd_at = length - tail_len + pos
    (_, _, _, _, count, cd_size, cd_offset, _) = struct.unpack_from("<4s4H2LH", tail, pos)
    end_of_directory = eocd_at
    loc = blob.read(eocd_at - 20, 20) if eocd_at >= 20 else b""
    if loc[:4] == _EOCD64_LOC:  # torch always writes zip64 records; their values win, as in zipfile
        rec_at = eocd_at - 20 - 56
        rec = blob.read(rec_at, 56) if rec_at >= 0 else b""
        if rec[:4] != _EOCD64:
            (rec_at,) = struct.unpack_from("<Q", loc, 8)
            rec = blob.read(rec_at, 56)
        if rec[:4] != _EOCD64 or len(rec) < 56:
            raise CorruptZip("corrupt zip: bad zip64 end record")
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", rec, 32)
        end_of_directory = rec_at
    elif count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        raise CorruptZip("corrupt zip: zip64 locator missing")
    concat = end_of_directory - cd_size - cd_offset  # bytes before the archive (zipfile allows them)
    if cd_size > MAX_DIRECTORY:
        raise CorruptZip(f"corrupt zip: a central directory of {cd_size} bytes is beyond belief")
    if concat < 0 or cd_offset + concat + cd_size > length:
        raise CorruptZip("corrupt zip: the central directory lies outside the file")
    data = blob.read(cd_offset + concat, cd_size)
    entries = _parse_directory(blob, data, count, concat)
    if concat and not _headers_found(blob, entries):
        # a wrong directory offset rather than bytes before the archive: offsets count from 0
        entries = [Entry(e.name, e.header_offset - concat, e.compressed_size, e.size, e.method) for e in entries]
    if not _headers_found(blob, entries):
        raise CorruptZip("corrupt zip: the central directory points at no local file header")
    return entries


def _headers_found(blob: Blob, entries: list[Entry]) -> bool:
    """The first and last entries start with a local header (checking all would cost a read each)."""
    return all(blob.read(e.header_offset, 4) == _LOCAL for e in entries[:1] + entries[-1:])


def _parse_directory(blob: Blob, data: bytes, count: int, concat: int) -> list[Entry]:
    entries: list[Entry] = []
    p = 0
    while p + 46 <= len(data):
        (sig, _, _, flags, method, _, _, _, csize, usize, nlen, xlen, clen, _, _, _, hoff) = \
            _CENTRAL_FMT.unpack_from(data, p)
        if sig != _CENTRAL:
            if len(entries) >= count:
                break
            raise CorruptZip("corrupt zip: bad central directory entry")
        name_bytes = data[p + 46 : p + 46 + nlen]
        if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or hoff == 0xFFFFFFFF:
            usize, csize, hoff = _zip64_extra(data[p + 46 + nlen : p + 46 + nlen + xlen], usize, csize, hoff)
        p += 46 + nlen + xlen + clen
        name = name_bytes.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        entries.append(Entry(name, hoff + concat, csize, usize, method))
    if len(entries) < min(count, 1):
        raise CorruptZip("corrupt zip: the central directory lists no readable entry")
    return entries


def sweep_local_headers(blob: Blob) -> list[Entry]:
    """Every plausible local file header in the blob, for archives without a usable directory."""
    entries: list[Entry] = []
    chunk = 4 << 20
    offset = 0
    while offset < blob.length and len(entries) < MAX_SWEPT:
        data = blob.read(offset, chunk + 3)
        p = data.find(_LOCAL)
        while 0 <= p < chunk:
            entry = _local_entry(blob, offset + p)
            if entry is not None:
                entries.append(entry)
            p = data.find(_LOCAL, p + 1)
        offset += chunk
    return entries


def _local_entry(blob: Blob, at: int) -> Entry | None:
    head = blob.read(at, 30)
    if len(head) < 30:
        return None
    (_, _, flags, method, _, _, _, csize, usize, nlen, xlen) = _LOCAL_FMT.unpack(head)
    if nlen == 0 or nlen > 4096 or method not in (0, 8):
        return None
    name = blob.read(at + 30, nlen).decode("utf-8", "replace")
    start = at + 30 + nlen + xlen
    room = blob.length - start
    if room < 0:
        return None
    if (flags & 0x08 and csize == 0) or csize == 0xFFFFFFFF or csize > room:
        csize = room  # size unknown or cut short: read to the end; the pickle walk finds STOP itself
    return Entry(name, at, csize, usize, method, swept=True)


def member_blob(blob: Blob, entry: Entry, limit: int) -> Blob:
    """A member's bytes: a region of the blob when stored, inflated in memory (up to ``limit``) when deflated.

    Sizes are not trusted: a stored member ends at the end of the blob at the
    latest, a deflated one is inflated until its stream ends, whatever size it declares.
    """
    size = local_header_size(blob.read(entry.header_offset, 30))
    if size is None:
        raise InputError(f"archive member {entry.name!r} has no local file header where the directory says")
    start = entry.header_offset + size
    csize = min(entry.compressed_size, blob.length - start)
    if entry.method == 0:
        return blob.sub(start, csize)
    if entry.method != 8:
        raise InputError(f"archive member {entry.name!r} uses compression method {entry.method}, "
                         "which torch cannot read")
    out = inflate(_chunks(blob, start, csize), limit, entry.name)
    if len(out) > limit:
        raise LimitExceeded(f"archive member {entry.name!r} inflates past the limit of {limit} bytes")
    return Blob.from_bytes(out)


def _chunks(blob: Blob, start: int, length: int) -> Iterator[bytes]:
    for at in range(start, start + length, _CHUNK):
        raw = blob.read(at, min(_CHUNK, start + length - at))
        if not raw:
            return
        yield raw
