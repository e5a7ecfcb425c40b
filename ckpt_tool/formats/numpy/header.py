"""A ``.npy`` header read as NumPy's own reader reads it (numpy/lib/_format_impl.py ``_read_array_header``).

The header is a Python literal (``ast.literal_eval``: never evaluated) with
exactly the keys ``descr``, ``fortran_order`` and ``shape``; NumPy refuses
any other, and so does ckpt, with NumPy's reason. The parse needs neither
NumPy nor torch (formats/ stays torch-free); tests/formats/test_numpy_files.py
checks it against ``numpy.lib.format`` header by header.
"""
from __future__ import annotations

import ast
import struct
from dataclasses import dataclass

from ... import dtypes
from ...errors import InputError

MAGIC = b"\x93NUMPY"
_VERSIONS = {(1, 0): ("<H", "latin1"), (2, 0): ("<I", "latin1"), (3, 0): ("<I", "utf8")}
_KEYS = {"descr", "fortran_order", "shape"}
# NumPy's default max_header_size (np.load refuses a longer header unless the file is trusted)
MAX_HEADER = 10000
# MLX writes bfloat16 as two-byte void records (mx.save / mx.savez): NumPy reads raw bytes, MLX bfloat16
MLX_BFLOAT16 = "<V2"


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says: its dtype (None for an object array), shape, order and where data starts."""

    descr: str
    dtype: dtypes.DType | None
    shape: tuple[int, ...]
    fortran_order: bool
    data_start: int  # offset of the first data byte from the start of the .npy bytes

    @property
    def is_object(self) -> bool:
        return self.dtype is None

    @property
    def stride(self) -> tuple[int, ...] | None:
        """Element strides of a Fortran-order array (None: C order, contiguous)."""
        if not self.fortran_order or len(self.shape) < 2:
            return None
        out: list[int] = []
        acc = 1
        for dim in self.shape:
            out.append(acc)
            acc *= max(dim, 1)
        return tuple(out)


def header_length(head: bytes, where: str) -> tuple[int, int, str]:
    """(header start, header length, encoding) from the first 12 bytes."""
    if not head.startswith(MAGIC) or len(head) < 10:
        raise InputError("not a .npy array (no \\x93NUMPY magic, or truncated)", where)
    version = (head[6], head[7])
    info = _VERSIONS.get(version)
    if info is None:
        raise InputError(f"unsupported .npy format version {version[0]}.{version[1]} (np.load reads 1.0, 2.0 and "
                         "3.0)", where)
    fmt, encoding = info
    start = 8 + struct.calcsize(fmt)
    if len(head) < start:
        raise InputError("truncated .npy header", where)
    (n,) = struct.unpack_from(fmt, head, 8)
    return start, n, encoding


def parse_header(head: bytes, where: str) -> NpyHeader:
    """The header of the ``.npy`` bytes starting ``head`` (which holds at least the whole header)."""
    start, n, encoding = header_length(head, where)
    raw = head[start:start + n]
    if len(raw) < n:
        raise InputError(f"truncated .npy header: it claims {n} bytes", where)
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InputError(f"bad .npy header: not {encoding} text ({exc.reason})", where) from None
    if len(text) > MAX_HEADER:
        raise InputError(f"bad .npy header: {len(text)} characters, over NumPy's limit of {MAX_HEADER} "
                         "(np.load refuses it without allow_pickle)", where)
    try:
        d = ast.literal_eval(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise InputError("bad .npy header: not a Python literal (np.load: 'Cannot parse header')", where) from None
    if not isinstance(d, dict):
        raise InputError("bad .npy header: not a dictionary", where)
    if set(d) != _KEYS or len(d) != 3:
        raise InputError(f"bad .npy header: keys {sorted(map(str, d))}, NumPy expects descr, fortran_order, shape",
                         where)
    shape, fortran, descr = d["shape"], d["fortran_order"], d["descr"]
    if not isinstance(shape, tuple) or not all(type(x) is int for x in shape):
        raise InputError(f"bad .npy header: shape is not a tuple of integers: {shape!r}", where)
    if any(x < 0 for x in shape):
        raise InputError(f"bad .npy header: negative dimension in shape {shape!r}", where)
    if not isinstance(fortran, bool):
        raise InputError(f"bad .npy header: fortran_order is not a bool: {fortran!r}", where)
    return NpyHeader(_descr_text(descr), _dtype(descr, where), shape, fortran, start + n)


def _descr_text(descr: object) -> str:
    return descr if isinstance(descr, str) else repr(descr)


def _dtype(descr: object, where: str) -> dtypes.DType | None:
    """ckpt's dtype of a simple descr; None for an object array; InputError for what ckpt does not read."""
    if not isinstance(descr, str):
        if _has_object(descr):
            return None  # np.load(allow_pickle=True) unpickles it: the pickle is judged, never run
        raise InputError(f"structured NumPy dtype {_descr_text(descr)[:80]} (records of named fields): not an "
                         "array of weights; ckpt reads plain numeric arrays", where)
    code = descr.strip()
    if code.lstrip("<>|=")[:1] in ("O",) or code.lstrip("<>|=").startswith("object"):
        return None
    if code == MLX_BFLOAT16 or code == "|V2":
        return dtypes.BY_NAME["bfloat16"]
    if code.startswith(">") and code[1:] not in ("i1", "u1", "b1"):
        raise InputError(f"big-endian NumPy array ({code}): ckpt reads little-endian data only; rewrite it with "
                         f"arr.astype(arr.dtype.newbyteorder('<'))", where)
    found = dtypes.BY_NUMPY.get(code) or dtypes.BY_NUMPY.get("<" + code.lstrip("<>|="))
    if found is None:
        raise InputError(f"NumPy dtype {code!r} is not a tensor dtype (strings, dates and void records are not "
                         "weights)", where)
    return found


def _has_object(descr: object) -> bool:
    """Whether a structured or subarray descr holds an object field anywhere (NumPy's ``hasobject``).

    A list is a record: fields ``(name, descr[, shape])``; a tuple is a subarray ``(descr, shape)``.
    Anything else is no descr NumPy writes: counted as an object, so it fails closed.
    """
    if isinstance(descr, str):
        code = descr.lstrip("<>|=")
        return code[:1] == "O" or code.startswith("object")
    if isinstance(descr, tuple) and len(descr) == 2:
        return _has_object(descr[0])
    if isinstance(descr, list):
        return any(not isinstance(f, tuple) or len(f) not in (2, 3) or _has_object(f[1]) for f in descr)
    return True
