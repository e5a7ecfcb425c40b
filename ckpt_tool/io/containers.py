"""The small containers a pickle may hide in: tar archives (torch 0.1) and NumPy ``.npy`` files."""
from __future__ import annotations

import ast
import struct

from ..errors import InputError
from .blob import Blob


def json_object_starts(data: bytes) -> bool:
    """A safetensors header: a JSON object, after the whitespace serde_json allows before it."""
    return data.lstrip(b" \t\n\r")[:1] == b"{"


def safetensors_header_length(head: bytes) -> int | None:
    """The header length a safetensors file's first bytes claim, when a JSON object follows it; else None.

    The one safetensors sniff: the format detector and the scanner both ask it.
    """
    if len(head) < 9 or not json_object_starts(head[8:]):
        return None
    (n,) = struct.unpack_from("<Q", head)
    return n if n >= 2 else None


# The first pickle of every legacy (pre-zip) torch.save file: its magic number.
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def tar_members(blob: Blob) -> list[tuple[str, Blob]] | None:
    """Regular members of a tar archive (torch's oldest format), or None if it is not one."""
    if blob.length < 512:
        return None
    head = blob.read(0, 512)
    if head[257:262] != b"ustar" and not _tar_checksum_ok(head):
        return None
    import tarfile  # 3 ms of imports (shutil, bz2, lzma): only for a file that looks like a tar

    try:
        with tarfile.open(fileobj=blob.stream(), mode="r:") as tar:
            return [(m.name, blob.sub(m.offset_data, m.size)) for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, EOFError, OSError, ValueError):
        # not a tar after all (or a corrupt one torch would refuse too)
        return None


def _tar_checksum_ok(head: bytes) -> bool:
    try:
        stored = int(head[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(head[:148]) + 256 + sum(head[156:512])


def npy_pickle_offset(blob: Blob) -> int | None:
    """Where the pickled data of an object-dtype ``.npy`` starts; None for plain arrays."""
    head = blob.read(0, 12)
    if len(head) < 10:
        raise InputError("truncated .npy header")
    major = head[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", head, 8)
        start = 10
    elif major in (2, 3):
        (hlen,) = struct.unpack_from("<I", head, 8)
        start = 12
    else:
        raise InputError(f"unknown .npy version {major}")
    if hlen > 1 << 20:
        raise InputError(".npy header is too large")
    text = blob.read(start, hlen).decode("latin-1")
    try:
        header = ast.literal_eval(text)  # a literal only: ast never evaluates code
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise InputError(f"bad .npy header: {exc}") from None
    if not isinstance(header, dict) or "descr" not in header:
        raise InputError("bad .npy header: no 'descr'")
    return start + hlen if _has_object(header["descr"]) else None


def _has_object(descr: object) -> bool:
    if isinstance(descr, str):
        return descr.lstrip("<>|=")[:1] == "O"
    if isinstance(descr, (list, tuple)):
        return any(_has_object(d) for d in descr)
    return False
