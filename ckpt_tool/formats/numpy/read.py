"""NumPy weight files: a ``.npy`` array (or a pickled object) and a ``.npz`` archive of them.

``np.save``/``np.savez``/``np.savez_compressed`` and MLX's ``mx.save``/``mx.savez``
write them. A plain array is a header and its raw bytes: read like a
safetensors entry (metadata from the header, data left in place). An object
array is a pickle that ``np.load(allow_pickle=True)`` would run: ckpt reads it
with the restricted unpickler (nothing imported or called) and the static walk
judges it, as for any pickle. An ``.npz`` is a zip of ``.npy`` members, stored
or deflated; its keys are the member names without ``.npy``, as ``np.load``
gives them, and a single ``.npy`` array is ``arr_0``, the name ``np.savez``
gives an unnamed array.
"""
from __future__ import annotations

import io
import zlib
from collections import OrderedDict
from typing import Any

from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io import open_bytes, storage_source
from ...io.zip import ZipArchive
from ...model import DataSource, GlobalRef, StorageRef, TensorMeta
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import NumpyArray, restricted_load_stream
from ..interface import FormatReader, Loaded, ReadOptions
from .header import MLX_BFLOAT16, NpyHeader, header_length, parse_header

SINGLE_KEY = "arr_0"
_HEAD = 1 << 16  # enough for any header NumPy reads (its limit is 10,000 characters)
MLX_WARNING = ("bfloat16 stored as two-byte void records ('<V2', as MLX's mx.save/mx.savez write it): read as "
               "bfloat16; np.load gives raw bytes for them")


def read_npy(path: str, options: ReadOptions) -> Loaded:
    """A ``.npy`` file: one array under ``arr_0``, or the object an object array pickles."""
    with open_bytes(path) as data:
        size = data.size
        head = data.read_upto(0, 12)
        start, n, _ = header_length(head, path)
        head = data.read_upto(0, start + n)
    header = parse_header(head, path)
    if header.is_object:
        with open_bytes(path) as data:
            if size - header.data_start > options.limits.max_pickle_bytes:
                raise LimitExceeded(f"object array pickle of {size - header.data_start} bytes, over the limit of "
                                    f"{options.limits.max_pickle_bytes} (raise it with --max-pickle-bytes)", path)
            raw = data.read_upto(header.data_start, size - header.data_start)
        return _object_array(raw, path, options, "object array")
    nbytes = _nbytes(header, SINGLE_KEY, path)
    if header.data_start + nbytes > size:
        raise InputError(f"truncated .npy file: its header needs {nbytes} bytes of data but "
                         f"{size - header.data_start} follow", path)
    source = storage_source(path, lambda _key: (header.data_start, nbytes))
    meta = _tensor(SINGLE_KEY, header, StorageRef(source, SINGLE_KEY, nbytes))
    return Loaded(Format.NUMPY, OrderedDict([(SINGLE_KEY, meta)]), sources=(source,), layout="state_dict",
                  warnings=(MLX_WARNING,) if header.descr in (MLX_BFLOAT16, "|V2") else (), tensors=(meta,))


def read_npz(path: str, options: ReadOptions) -> Loaded:
    """A ``.npz`` archive: each ``NAME.npy`` member as the tensor ``NAME``."""
    archive = ZipArchive(path, options.limits.max_member_bytes)
    source = NpzSource(archive)
    root: OrderedDict[str, Any] = OrderedDict()
    tensors: list[TensorMeta] = []
    warnings: list[str] = []
    references: list[GlobalRef] = []
    names = archive.names()
    if len(names) > options.limits.max_tensors:
        raise LimitExceeded(f".npz archive holds {len(names)} members, over the limit of "
                            f"{options.limits.max_tensors} (raise it with --max-tensors)", path)
    other = [n for n in names if not n.endswith(".npy")]
    if other:
        warnings.append(f"{len(other)} member(s) not .npy arrays (np.load returns their bytes), not read: "
                        + ", ".join(repr(n) for n in other[:5]))
    mlx = False
    for name in names:
        if not name.endswith(".npy"):
            continue
        key = name[:-4]
        where = f"{path} > {name}"
        header = parse_header(source.head(name), where)
        if header.is_object:
            raw = archive.read(name, options.limits.max_pickle_bytes)
            obj = _object_array(raw[header.data_start:], path, options, f"{name} (object array)")
            references.extend(obj.references)
            warnings.extend(obj.warnings)
            root[key] = obj.root
            continue
        nbytes = _nbytes(header, key, where)
        member = archive.members[name]
        if header.data_start + nbytes > member.size:
            raise InputError(f"truncated .npz member {name!r}: its header needs {nbytes} bytes of data but "
                             f"{member.size - header.data_start} follow", path)
        source.starts[name] = header.data_start
        meta = _tensor(key, header, StorageRef(source, name, nbytes))
        root[key] = meta
        tensors.append(meta)
        mlx = mlx or header.descr in (MLX_BFLOAT16, "|V2")
    if mlx:
        warnings.append(MLX_WARNING)
    if not names:
        raise InputError("empty .npz archive: it holds no arrays", path)
    flat = len(tensors) == len(root)
    return Loaded(Format.NPZ, root, tuple(references), tuple(warnings), (source,), layout="state_dict",
                  tensors=tuple(tensors) if flat else None)


class NpzSource(DataSource):
    """The arrays of a ``.npz``: stored members read in place, deflated ones inflated (one held at a time)."""

    def __init__(self, archive: ZipArchive) -> None:
        self.archive = archive
        self.path = archive.path
        self.starts: dict[str, int] = {}  # member -> offset of its data after the .npy header
        self._plain = storage_source(archive.path, self._region, archive.close, archive.source)
        self._inflated: tuple[str, bytes] | None = None

    def _region(self, key: str) -> tuple[int, int]:
        offset, size = self.archive.region(key)
        start = self.starts.get(key, 0)
        return offset + start, size - start

    def head(self, name: str) -> bytes:
        """The first bytes of a member (its .npy header), inflating only what they need."""
        member = self.archive.members[name]
        self.archive.check_readable(member)
        offset = self.archive.data_offset(name)
        if self.archive.source is None:
            raise InputError("archive has no byte source", self.path)
        raw = self.archive.source.read_upto(offset, min(member.compressed_size, _HEAD))
        if member.method == 0:
            return raw
        try:
            return zlib.decompressobj(-15).decompress(raw, _HEAD)
        except zlib.error as exc:
            raise InputError(f"corrupt .npz member {name!r}: {exc}", self.path) from None

    def read(self, key: str, offset: int, length: int) -> bytes:
        member = self.archive.members[key]
        if member.method == 0:
            return self._plain.read(key, offset, length)
        if self._inflated is None or self._inflated[0] != key:
            self._inflated = (key, self.archive.read(key, self.archive.member_limit, "--max-member-bytes"))
        start = self.starts.get(key, 0) + offset
        data = self._inflated[1]
        if start + length > len(data):
            raise InputError(f"member {key!r} holds {len(data)} bytes but an array needs {start + length}",
                             self.path)
        return data[start:start + length]

    def close(self) -> None:
        self._inflated = None
        self._plain.close()


def _object_array(raw: bytes, path: str, options: ReadOptions, where: str) -> Loaded:
    """The object an object array pickles (restricted: nothing imported or called), as np.load would return it."""
    stream = io.BytesIO(raw)
    result = restricted_load_stream(stream, where=where, path=path, limits=options.limits,
                                    read_blob=options.read_blob, opcodes=set())
    obj = result.obj
    if isinstance(obj, NumpyArray) and obj.type_string == "object":
        items = list(obj.items)
        obj = items[0] if obj.shape == () and len(items) == 1 else items
    return Loaded(Format.NUMPY, obj, tuple(result.references))


def _nbytes(header: NpyHeader, key: str, where: str) -> int:
    assert header.dtype is not None  # object arrays are read as pickles before this
    numel = 1
    for dim in header.shape:
        numel *= dim
    return header.dtype.nbytes(numel)


def _tensor(key: str, header: NpyHeader, ref: StorageRef) -> TensorMeta:
    assert header.dtype is not None
    return TensorMeta(key, header.dtype.name, header.shape, header.stride, 0, ref, "cpu")


def is_npz(first_member: str) -> bool:
    """Whether a zip whose first member is ``first_member`` is an ``.npz`` (np.savez names every member NAME.npy)."""
    return first_member.endswith(".npy")


_NOTE = "a NumPy file: np.load reads it, not torch.load (which refuses it: no torch zip, no pickle at byte 0)"
NPY_READER = FormatReader(Format.NUMPY, read_npy, weights_only_container=wo_input.OTHER, weights_only_note=_NOTE)
NPZ_READER = FormatReader(Format.NPZ, read_npz, weights_only_container=wo_input.OTHER, weights_only_note=_NOTE)

__all__ = ["NPY_READER", "NPZ_READER", "SINGLE_KEY", "NpzSource", "header_length", "is_npz", "read_npy", "read_npz"]
