"""The small containers a pickle may hide in: tar archives (torch 0.1) and NumPy ``.npy`` files."""
from __future__ import annotations

import ast
import io
import struct

from ..errors import InputError
from .regions import Blob


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


def npy_header(blob: Blob) -> tuple[int, int, int, int]:
    """(major version, minor version, header start, header length) of a ``.npy`` file; InputError if malformed."""
    head = blob.read(0, 12)
    if len(head) < 10:
        raise InputError("truncated .npy header")
    major = head[6]
    if major not in (1, 2, 3):
        raise InputError(f"unknown .npy version {major}")
    start = 10 if major == 1 else 12
    (hlen,) = struct.unpack_from("<H" if major == 1 else "<I", head, 8)
    if hlen > 1 << 20:
        raise InputError(".npy header is too large")
    return major, head[7], start, hlen


def npy_pickle_offset(blob: Blob) -> int | None:
    """Where the pickled data of an object-dtype ``.npy`` starts; None for plain arrays.

    The literal parse, without NumPy (which only tensors/ imports): it fails
    closed, counting any field whose type is not a plain numeric or string
    code as an object. The scanner's callers hand it NumPy's own reading
    (tensors/numpy_reads.npy_pickle_offset); this is the stand-in when NumPy
    is not installed, and the Scanner's default.
    """
    _, _, start, hlen = npy_header(blob)
    return literal_npy_offset(blob, start, hlen)


def literal_npy_offset(blob: Blob, start: int, hlen: int) -> int | None:
    """The object-array offset from a literal parse of the header dict (ast.literal_eval: never evaluated)."""
    text = blob.read(start, hlen).decode("latin-1")
    try:
        header = ast.literal_eval(text)  # a literal only: ast never evaluates code
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise InputError(f"bad .npy header: {exc}") from None
    if not isinstance(header, dict) or "descr" not in header:
        raise InputError("bad .npy header: no 'descr'")
    return start + hlen if _has_object(header["descr"]) else None


def _has_object(descr: object) -> bool:
    """Fail closed without NumPy: any field whose type is not a plain numeric or string code counts."""
    if isinstance(descr, str):
        code = descr.lstrip("<>|=")
        return code[:1] in ("O", "o") or code.lower().startswith("object") or not code[:1].isalpha()
    if isinstance(descr, (list, tuple)):
        return any(_has_object(d) for d in descr if not (isinstance(d, int) or d == ()))
    return True


# A legacy torch file starts with its magic number pickled; torch compares the value, not the bytes.
LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
_INT_OPS = frozenset(["INT", "LONG", "LONG1", "LONG4"])
_NEUTRAL_OPS = frozenset(["PROTO", "FRAME", "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"])


def is_legacy_magic(head: bytes) -> bool:
    """Whether the first pickle in ``head`` is torch's legacy magic number, whatever opcodes spell it.

    torch.save writes it with LONG1 after PROTO 2; ``pickle_protocol=0``
    writes LONG text; a hand-made file may use LONG4 or INT text. torch's
    legacy loader only compares the unpickled value (``pickletools`` reads
    the opcodes here: nothing is unpickled).
    """
    if head.startswith(LEGACY_MAGIC):
        return True
    at = 2 if head[:1] == b"\x80" else 0  # PROTO, then maybe a FRAME, then the integer's opcode
    at += 9 if head[at : at + 1] == b"\x95" else 0
    if head[at : at + 1] not in (b"I", b"L", b"\x8a", b"\x8b"):
        return False  # every pickle torch.save writes for an object starts otherwise: no parse
    import pickletools

    value = None
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(head[:256])):
            if op.name == "STOP":
                return value == LEGACY_MAGIC_NUMBER and type(value) is int
            if op.name in _INT_OPS and value is None:
                value = arg
            elif op.name not in _NEUTRAL_OPS:
                return False
    except (ValueError, TypeError, EOFError, OverflowError):
        return False
    return False

