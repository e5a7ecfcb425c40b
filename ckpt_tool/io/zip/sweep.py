"""Zip archives as the scanner reads them: every entry the directory lists, or every local header.

The entries come from the one zip reader (io/zip/archive.py) in its lenient
mode. When the central directory is broken, the local file headers are swept
instead, so a payload is found in any archive some reader might still open.
A member's bytes are a region of the blob when stored, inflated when deflated.
"""
from __future__ import annotations

from collections.abc import Iterator

from ...errors import InputError, LimitExceeded
from ..regions import Blob, BlobSource
from .archive import LOCAL_FMT, Member, ZipArchive, inflate, local_header_size

_LOCAL = b"PK\x03\x04"
MAX_SWEPT = 1_000_000
_CHUNK = 1 << 20  # compressed bytes inflated at a time


def read_directory(blob: Blob) -> list[Member]:
    """Every entry the central directory lists, read leniently; InputError when there is none to read."""
    return ZipArchive("", source=BlobSource(blob), lenient=True).entries


def sweep_local_headers(blob: Blob) -> list[Member]:
    """Every plausible local file header in the blob, for archives without a usable directory."""
    entries: list[Member] = []
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


def _local_entry(blob: Blob, at: int) -> Member | None:
    head = blob.read(at, 30)
    if len(head) < 30:
        return None
    (_, _, flags, method, _, _, crc, csize, usize, nlen, xlen) = LOCAL_FMT.unpack(head)
    if nlen == 0 or nlen > 4096 or method not in (0, 8):
        return None
    name = blob.read(at + 30, nlen).decode("utf-8", "replace")
    start = at + 30 + nlen + xlen
    room = blob.length - start
    if room < 0:
        return None
    if (flags & 0x08 and csize == 0) or csize == 0xFFFFFFFF or csize > room:
        csize = room  # size unknown or cut short: read to the end; the pickle walk finds STOP itself
    return Member(name, at, csize, usize, method, crc, flags)


def member_blob(blob: Blob, entry: Member, limit: int) -> Blob:
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
