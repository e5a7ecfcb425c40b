"""The one zip reader: torch's (miniz's) reading of an archive, or a lenient one for the scanner.

``zipfile`` builds a ZipInfo per entry (1.1 s for 200k storages) and does not
let us validate offsets before trusting them. This reads the central
directory once, checks every offset and size against the file size, and finds
member data offsets only when a member is actually read.

Strict (every command's reading) is what torch accepts. Lenient (the
scanner's) lists every entry some reader might still open, as ``zipfile``
reads them: bytes before the archive, names without the UTF-8 flag in cp437,
entries that point past the end of the file, more entries than the end
record counts; a payload is found in any of them.
"""
from __future__ import annotations

import bisect
import struct
import sys
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from ...errors import InputError, LimitExceeded
from ..bytesource import ByteSource
from ..paths import open_bytes
from .miniz import MinizIndex, case_twins

_EOCD = b"PK\x05\x06"
_EOCD64_LOC = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
# the 46-byte central-directory entry, unpacking only the fields used:
# signature, flags, method, crc, compressed size, size, name/extra/comment lengths, local header offset
_CENTRAL_FMT = struct.Struct("<4s4xHH4x3L3H8xL")
# General-purpose flags miniz (torch's zip reader) refuses to extract: encrypted, patched, strong encryption.
UNSUPPORTED_FLAGS = 0x0001 | 0x0020 | 0x0040
LOCAL_FMT = struct.Struct("<4s5H3L2H")  # the 30-byte local file header
_NAME_EXTRA = struct.Struct("<HH")  # its name and extra-field lengths, at byte 26
_HEADER_BLOCK = 64 << 10  # local headers of neighbouring small members are read together
_BATCH_AFTER = 8  # members located one by one before neighbours are located in blocks
MAX_DIRECTORY = 1 << 30  # lenient: 200k storages take ~15 MB of central directory


class Member(NamedTuple):
    """One central-directory entry (a NamedTuple: archives can hold 200,000 of them)."""

    name: str
    header_offset: int
    compressed_size: int
    size: int
    method: int
    crc: int
    flags: int


class ZipArchive:
    """The members of a zip file, by name, with lazily located data offsets."""

    def __init__(self, path: str, member_limit: int = 1 << 31, *, data: bytes | None = None,
                 source: ByteSource | None = None, lenient: bool = False) -> None:
        """The archive in file (or URL) ``path``, or in ``data`` (torch.save bytes nested in a pickle, a DCP chunk).

        ``lenient`` reads the directory as the scanner needs it (see the module's docstring); ``entries``
        then lists what it found, with local header offsets counted from the start of the file.
        """
        self.path = path
        self.member_limit = member_limit  # largest size a deflated member may inflate to
        self.lenient = lenient
        self._data = data
        self.source: ByteSource | None = None if data is not None else (source or open_bytes(path))
        self.file_size = self.source.size if self.source is not None else len(data or b"")
        self.members: dict[str, Member] = {}
        self.duplicates: list[str] = []
        self.entries: list[Member] = []  # every central-directory entry, duplicates included, in order
        self._data_offsets: dict[str, int] = {}
        self._lookups = 0
        self._by_offset: list[tuple[int, str]] = []
        self._offsets: list[int] | None = None
        self.compressed = 0  # members not stored (torch.save stores all: then storages are plain file regions)
        self._index: MinizIndex | None = None
        try:
            self._read_central_directory()
        except BaseException:
            self.close()  # a corrupt archive must not leak its descriptor (long-running callers)
            raise

    def _pread(self, n: int, offset: int) -> bytes:
        if self.source is None:
            chunk = (self._data or b"")[offset : offset + n]
            if len(chunk) != n or offset < 0:
                raise InputError(f"truncated: needed {n} bytes at offset {offset}, the archive ends first", self.path)
            return chunk
        return self.source.read(offset, n)

    def close(self) -> None:
        """Release the file (a later read reopens it)."""
        if self.source is not None:
            self.source.close()

    # -- central directory ---------------------------------------------------
    def _read_central_directory(self) -> None:
        tail_len = min(self.file_size, 65536 + 22)
        tail = self._pread(tail_len, self.file_size - tail_len)
        pos = tail.rfind(_EOCD)
        while pos >= 0 and len(tail) - pos < 22:  # as miniz: a signature without room for the record is no record
            pos = tail.rfind(_EOCD, 0, pos)
        if pos < 0:
            raise InputError("corrupt or truncated zip archive: no end-of-archive record", self.path)
        eocd_at = self.file_size - tail_len + pos
        (_, _, _, _, count, cd_size, cd_offset, _) = struct.unpack_from("<4s4H2LH", tail, pos)
        loc = tail[pos - 20 : pos] if pos >= 20 else self._pread(20, eocd_at - 20) if eocd_at >= 20 else b""
        directory_end = eocd_at
        if loc[:4] == _EOCD64_LOC or count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
            # torch (miniz) writes a zip64 record into every archive and trusts it
            # over the classic one: read the directory where torch reads it.
            count, cd_size, cd_offset, directory_end = self._zip64_directory(eocd_at, loc)
        base = directory_end - cd_size - cd_offset if self.lenient else 0  # bytes before the archive
        if self.lenient and cd_size > MAX_DIRECTORY:
            raise InputError(f"corrupt zip archive: a central directory of {cd_size} bytes is beyond belief", self.path)
        if base < 0:  # lenient only: the directory would overlap its own end record
            raise InputError("corrupt zip archive: the central directory lies outside the file", self.path)
        start = cd_offset + base
        if start + cd_size > self.file_size or start < 0:
            raise InputError(
                "corrupt or truncated zip archive: the central directory lies past the end of the file",
                self.path,
            )
        # Over a URL the directory is read with the 4 KiB before it: torch writes its small records
        # (version, byteorder, serialization id) last, and they are read next (one request saved).
        pad = min(start, 4096) if self.source is not None and self.source.remote else 0
        data = self._pread(cd_size + pad, start - pad)[pad:] if pad else self._pread(cd_size, start)
        self._read_entries(data, count, base)
        if self.lenient:
            if base and not self._headers_found():
                self._read_entries(data, count, 0)  # a wrong directory offset, not bytes before the archive
            if not self._headers_found():
                raise InputError("corrupt zip archive: the central directory points at no local file header",
                                 self.path)

    def _read_entries(self, data: bytes, count: int, base: int) -> None:
        """The ``count`` entries in ``data`` (lenient: as many as it holds), local headers ``base`` bytes on."""
        unpack = _CENTRAL_FMT.unpack_from
        new_member = tuple.__new__  # Member(...) without a Python-level __new__ call, 200,000 times
        pos = 0
        members: dict[str, Member] = {}
        self.members = members
        self.duplicates = []
        self._twins: bool | None = None  # names that differ only in case: found lazily (miniz.case_twins)
        order: list[Member] = []
        self.entries = order
        self.compressed = 0
        lenient = self.lenient
        bound = (1 << 66) if lenient else self.file_size  # lenient: an entry past the end is still listed
        plain = "cp437" if lenient else "utf-8"  # a name without the UTF-8 flag (strict: UTF-8, as torch reads it)
        end = len(data)
        for i in range(sys.maxsize if lenient else count):
            if pos + 46 > end:
                if lenient:
                    break
                raise InputError("corrupt zip archive: central directory is cut short", self.path)
            sig, flags, method, crc, csize, usize, nlen, xlen, clen, hoff = unpack(data, pos)
            if sig != _CENTRAL:
                if lenient and i >= count:
                    break  # bytes after the last entry the end record counts
                raise InputError("corrupt zip archive: bad central directory entry", self.path)
            name_bytes = data[pos + 46 : pos + 46 + nlen]
            if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or hoff == 0xFFFFFFFF:
                extra = data[pos + 46 + nlen : pos + 46 + nlen + xlen]
                usize, csize, hoff = zip64_extra(extra, usize, csize, hoff)
            pos += 46 + nlen + xlen + clen
            name = name_bytes.decode("utf-8" if flags & 0x0800 else plain, "replace")
            if hoff + 30 > bound or hoff + csize > bound:
                raise InputError(
                    f"corrupt or truncated zip archive: member {name!r} lies past the end of the file",
                    self.path,
                )
            member = new_member(Member, (name, hoff + base, csize, usize, method, crc, flags))
            order.append(member)
            if method:
                self.compressed += 1
            if name in members:
                self.duplicates.append(name)  # which one torch reads: resolve() replays miniz
                continue
            members[name] = member
        if lenient and len(order) < min(count, 1):
            raise InputError("corrupt zip archive: the central directory lists no readable entry", self.path)
        if not lenient and len(members) + len(self.duplicates) != count:
            raise InputError("corrupt zip archive: entry count does not match", self.path)

    def _headers_found(self) -> bool:
        """The first and last entries start with a local header (checking all would cost a read each)."""
        ends = self.entries[:1] + self.entries[-1:]
        return all(0 <= m.header_offset <= self.file_size - 4 and self._pread(4, m.header_offset) == _LOCAL
                   for m in ends)

    def _zip64_directory(self, eocd_at: int, loc: bytes) -> tuple[int, int, int, int]:
        """Entry count, directory size and offset from the zip64 record, and where that record starts."""
        if loc[:4] != _EOCD64_LOC:
            raise InputError("corrupt zip archive: zip64 locator missing", self.path)
        rec_at = eocd_at - 20 - 56  # lenient: right before the locator, as zipfile looks (bytes before the archive)
        if not self.lenient or rec_at < 0 or self._pread(4, rec_at) != _EOCD64:
            (rec_at,) = struct.unpack_from("<Q", loc, 8)  # where the locator says, as miniz looks
        if rec_at + 56 > self.file_size:
            raise InputError("corrupt zip archive: zip64 record past the end of the file", self.path)
        rec = self._pread(56, rec_at)
        if rec[:4] != _EOCD64:
            raise InputError("corrupt zip archive: bad zip64 record", self.path)
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", rec, 32)
        return count, cd_size, cd_offset, rec_at

    # -- members ---------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.members)

    def resolve(self, name: str) -> str | None:
        """The stored name of the member torch's reader finds for ``name`` (miniz ignores case).

        Unique names (every torch.save archive) are a dict lookup. With duplicate names, or names that
        differ only in case, miniz's sort and binary search are replayed (io/zip/miniz.py) and the member
        found becomes the one read by that name.
        """
        if self._twins is None:
            self._twins = case_twins(self.members)
        if not self.duplicates and not self._twins:
            if name in self.members:
                return name
            if self._index is None:
                joined = "\n".join(self.members)
                if joined == joined.lower():  # no capital letter in any name: folding the lookup is enough
                    low = name.lower()
                    return low if low in self.members else None
        if self._index is None:
            self._index = MinizIndex([m.name for m in self.entries])
        at = self._index.locate(name)
        if at is None:
            return None
        found = self.entries[at]
        if self.members.get(found.name) is not found:
            self.members[found.name] = found
            self._data_offsets.pop(found.name, None)
        return found.name

    def data_offset(self, name: str) -> int:
        """Absolute offset of a member's (stored) bytes, validated against the file size."""
        found = self._data_offsets.get(name)
        if found is not None:
            return found
        m = self.members[name]
        self._lookups += 1
        if self._lookups > _BATCH_AFTER:
            self._locate_neighbours(m)
            found = self._data_offsets.get(name)
            if found is not None:
                return found
        size = local_header_size(self._pread(30, m.header_offset))
        if size is None:
            raise InputError(f"corrupt zip archive: bad local header for {name!r}", self.path)
        start = m.header_offset + size
        if start + m.compressed_size > self.file_size:
            raise InputError(
                f"truncated zip archive: member {name!r} needs {m.compressed_size} bytes past the end of the file",
                self.path,
            )
        self._data_offsets[name] = start
        return start

    def _locate_neighbours(self, m: Member) -> None:
        """Locate every member whose local header lies in the 64 KiB from ``m``'s, with one read.

        Streaming 200,000 small tensors otherwise costs one 30-byte read per member. Only headers that pass
        data_offset's checks are cached; any other member is located (and its error raised) the direct way.
        """
        if self._offsets is None:
            self._by_offset = sorted((x.header_offset, x.name) for x in self.members.values())
            self._offsets = [o for o, _ in self._by_offset]
        base = m.header_offset
        i = bisect.bisect_left(self._offsets, base)
        if i + 1 >= len(self._offsets) or self._offsets[i + 1] - base >= _HEADER_BLOCK:
            return  # no neighbour close by: a big member, located the direct way
        block = self._pread(min(_HEADER_BLOCK, self.file_size - base), base)
        unpack = LOCAL_FMT.unpack_from  # inline, not local_header_size: up to 200,000 headers a stream
        by_offset = self._by_offset
        for j in range(i, len(by_offset)):
            off, name = by_offset[j]
            rel = off - base
            if rel + 30 > len(block):
                break
            sig, _, _, _, _, _, _, _, _, nlen, xlen = unpack(block, rel)
            info = self.members[name]
            start = off + 30 + nlen + xlen
            if sig == _LOCAL and start + info.compressed_size <= self.file_size:
                self._data_offsets.setdefault(name, start)

    def check_readable(self, m: Member) -> None:
        """Refuse what torch's reader refuses to extract (miniz: "unsupported encryption")."""
        if m.flags & UNSUPPORTED_FLAGS:
            raise InputError(f"archive member {m.name!r} is encrypted (general-purpose flags {m.flags:#06x}); "
                             "torch.load refuses it with 'unsupported encryption'", self.path)
        if m.method not in (0, 8):
            raise InputError(f"archive member {m.name!r} uses unsupported compression {m.method}", self.path)

    def region(self, name: str) -> tuple[int, int]:
        """(offset, size) of a stored member, for zero-copy tensor reads."""
        m = self.members.get(name)
        if m is None:
            raise InputError(f"archive member {name!r} is missing", self.path)
        if m.flags & UNSUPPORTED_FLAGS or m.method:  # rare: checked in full only then (200,000 calls a stream)
            self.check_readable(m)
            raise InputError(f"archive member {name!r} is compressed; torch stores tensors uncompressed", self.path)
        return self.data_offset(name), m.size

    def read(self, name: str, limit: int = 1 << 31, option: str = "--max-pickle-bytes") -> bytes:
        """A whole member's bytes (stored or deflated), size-limited.

        ``option`` names the command-line option that raises ``limit``; a
        deflated member is also held to ``member_limit`` (--max-member-bytes).
        """
        m = self.members.get(name)
        if m is None:
            raise InputError(f"archive member {name!r} is missing", self.path)
        self.check_readable(m)
        if m.method != 0 and self.member_limit < limit:
            limit, option = self.member_limit, "--max-member-bytes"
        if m.size > limit:
            raise LimitExceeded(
                f"archive member {name!r} claims {m.size} bytes, over the limit of {limit} (raise it with {option})",
                self.path,
            )
        raw = self._pread(m.compressed_size, self.data_offset(name))
        if m.method == 0:
            return raw
        if m.method == 8:
            out = inflate([raw], m.size, name, self.path)  # never more than it declared (checked above)
            if len(out) > m.size:
                raise InputError(f"archive member {name!r} inflates past the {m.size} bytes it declares "
                                 "(a corrupt archive or a zip bomb)", self.path)
            return out
        raise InputError(f"archive member {name!r} uses unsupported compression {m.method}", self.path)


def local_header_size(head: bytes) -> int | None:
    """How many bytes the local file header at the start of ``head`` takes; None when there is none.

    Its own name and extra-field lengths count, not the central directory's
    (torch skips them so): the member's bytes start right after.
    """
    if len(head) < 30 or head[:4] != _LOCAL:
        return None
    nlen: int
    xlen: int
    nlen, xlen = _NAME_EXTRA.unpack_from(head, 26)
    return 30 + nlen + xlen


def inflate(chunks: Iterable[bytes], cap: int, name: str, path: str | None = None) -> bytes:
    """A deflated member's bytes from its compressed ``chunks``, at most ``cap + 1`` of them.

    A result longer than ``cap`` means the member inflates past it: the
    caller says which limit that is. Input past the end of the deflate
    stream is ignored; a stream cut short gives what it held.
    """
    d = zlib.decompressobj(-15)
    parts: list[bytes] = []
    room = cap + 1
    try:
        for raw in chunks:
            out = d.decompress(raw, room)  # room >= 1: a max_length of 0 would mean no limit
            parts.append(out)
            room -= len(out)
            if room <= 0 or d.eof:
                break
    except zlib.error as exc:
        raise InputError(f"archive member {name!r} is corrupt: {exc}", path) from None
    return b"".join(parts)


def zip64_extra(extra: bytes, usize: int, csize: int, hoff: int) -> tuple[int, int, int]:
    """Sizes and offset from a zip64 extra field, for the fields the entry marked 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            body = extra[pos + 4 : pos + 4 + size]
            vals = [struct.unpack_from("<Q", body, i)[0] for i in range(0, len(body) - 7, 8)]
            it = iter(vals)
            try:
                if usize == 0xFFFFFFFF:
                    usize = next(it)
                if csize == 0xFFFFFFFF:
                    csize = next(it)
                if hoff == 0xFFFFFFFF:
                    hoff = next(it)
            except StopIteration:
                break
            break
        pos += 4 + size
    return usize, csize, hoff
