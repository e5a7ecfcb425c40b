"""The torch 0.1 tar format, read statically as ``torch.serialization._legacy_load`` reads it.

A tar of three members: ``storages`` (a count pickle; per storage a
``(key, location, storage_type)`` pickle, an 8-byte element count and the raw
bytes; then a pickle of storage views), ``tensors`` (a count pickle; per
tensor a ``(key, storage_id, type)`` pickle and its ndim, sizes, strides and
offset in binary) and ``pickle`` (the object, whose persistent ids name
tensors by key). torch >= 2.6 refuses the format under ``weights_only=True``
(the CVE-2025-32434 fix: older torch ran its pickles unrestricted); with
``weights_only=False`` it loads. ckpt reads every pickle with the restricted
unpickler and only locates the storages: no tensor byte is read.
"""
from __future__ import annotations

import io
import struct
import tarfile
from typing import Any

from ...errors import InputError
from ...format_names import Format
from ...io import ByteSource, open_bytes, storage_source, window
from ...model import DataSource, GlobalRef
from ...pickles import CVE_2025_32434_TAR
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import LazyStorage, LazyTensor, StorageType, restricted_load_stream
from ..interface import FormatReader, Loaded, ReadOptions

_COUNT = struct.Struct("<q")


def read_legacy_tar(path: str, options: ReadOptions) -> Loaded:
    fd = open_bytes(path)
    try:
        with io.BufferedReader(window(fd, 0, fd.size)) as f:
            try:
                with tarfile.open(fileobj=f, mode="r:") as tar:
                    members = {m.name: (m.offset_data, m.size) for m in tar.getmembers() if m.isfile()}
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                raise InputError(f"not a readable tar archive: {exc}", path) from None
        for name in ("storages", "tensors", "pickle"):
            if name not in members:
                raise InputError(f"tar-based legacy torch checkpoint without its {name!r} member "
                                 f"(torch.load fails: filename {name!r} not found)", path)
        reader = _TarReader(fd, path, members, options)
        regions: dict[str, tuple[int, int]] = {}
        source = storage_source(path, lambda key: _region(regions, key, path), data=fd)
        storages = reader.storages(regions, source)
        tensors = reader.tensors(storages)
        root = reader.object(tensors)
    finally:
        fd.close()
    return Loaded(Format.TORCH_TAR, root, tuple(reader.references), (CVE_2025_32434_TAR,), (source,))


def _region(regions: dict[str, tuple[int, int]], key: str, path: str) -> tuple[int, int]:
    found = regions.get(key)
    if found is None:
        raise InputError(f"storage {key!r} is not in the file", path)
    return found


class _TarReader:
    def __init__(self, fd: ByteSource, path: str, members: dict[str, tuple[int, int]], options: ReadOptions) -> None:
        self.fd = fd
        self.path = path
        self.members = members
        self.options = options
        self.references: list[GlobalRef] = []
        self._seen: set[tuple[str, str]] = set()

    def _stream(self, name: str) -> tuple[io.BytesIO, int]:
        start, size = self.members[name]
        if name != "storages":
            data = self.fd.read_upto(start, size)
            if len(data) != size:
                raise InputError(f"truncated tar member {name!r}", self.path)
            return io.BytesIO(data), start
        # storages hold the tensor bytes: read only the pickles, seek past the data
        return window(self.fd, start, size), start  # type: ignore[return-value]

    def _load(self, stream: Any, what: str, persistent: Any = None) -> Any:
        result = restricted_load_stream(stream, where=what, path=self.path, persistent_load=persistent,
                                        limits=self.options.limits, read_blob=self.options.read_blob)
        for ref in result.references:
            if (ref.module, ref.name) not in self._seen:
                self._seen.add((ref.module, ref.name))
                self.references.append(ref)
        return result.obj

    def storages(self, regions: dict[str, tuple[int, int]], source: DataSource) -> dict[str, LazyStorage]:
        stream, start = self._stream("storages")
        count = self._load(stream, "storages count")
        if type(count) is not int or count < 0:
            raise InputError("tar member 'storages' does not start with a storage count", self.path)
        out: dict[str, LazyStorage] = {}
        for i in range(count):
            record = self._load(stream, f"storage #{i}")
            if not (isinstance(record, tuple) and len(record) == 3 and isinstance(record[2], StorageType)
                    and record[2].dtype is not None):
                raise InputError(f"storage record #{i} is not (key, location, storage type)", self.path)
            key, location, dtype = str(record[0]), str(record[1]), record[2].dtype
            raw = stream.read(8)
            if len(raw) != 8:
                raise InputError(f"truncated: storage {key!r} has no element count", self.path)
            (numel,) = _COUNT.unpack(raw)
            nbytes = numel * dtype.itemsize
            at = stream.tell()
            if numel < 0 or at + nbytes > self.members["storages"][1]:
                raise InputError(f"truncated: storage {key!r} needs {nbytes} bytes past the end of its member",
                                 self.path)
            stream.seek(nbytes, io.SEEK_CUR)
            regions[key] = (start + at, nbytes)
            out[key] = LazyStorage(key, dtype, nbytes, location, source)
        views = self._load(stream, "storage views")
        for view in views if isinstance(views, list) else ():
            if not (isinstance(view, tuple) and len(view) == 4 and str(view[1]) in out):
                raise InputError("a storage view names an unknown storage", self.path)
            target, root_key, offset, numel = str(view[0]), str(view[1]), int(view[2]), int(view[3])
            root = out[root_key]
            size = root.dtype.itemsize
            if offset < 0 or numel < 0 or (offset + numel) * size > root.nbytes:
                raise InputError(f"a view of storage {root_key!r} reaches past its end", self.path)
            regions[target] = (regions[root_key][0] + offset * size, numel * size)
            out[target] = LazyStorage(target, root.dtype, numel * size, root.location, source)
        return out

    def tensors(self, storages: dict[str, LazyStorage]) -> dict[int, LazyTensor]:
        stream, _ = self._stream("tensors")
        count = self._load(stream, "tensors count")
        if type(count) is not int or count < 0:
            raise InputError("tar member 'tensors' does not start with a tensor count", self.path)
        out: dict[int, LazyTensor] = {}
        for i in range(count):
            record = self._load(stream, f"tensor #{i}")
            if not (isinstance(record, tuple) and len(record) == 3 and str(record[1]) in storages):
                raise InputError(f"tensor record #{i} names an unknown storage", self.path)
            head = stream.read(8)
            if len(head) != 8:
                raise InputError(f"truncated: tensor #{i} has no dimensions", self.path)
            (ndim,) = struct.unpack_from("<i", head)
            body = stream.read(16 * ndim + 8) if 0 <= ndim <= 64 else b""
            if len(body) != 16 * ndim + 8:
                raise InputError(f"truncated or invalid dimensions of tensor #{i}", self.path)
            sizes = struct.unpack_from(f"<{ndim}q", body)
            strides = struct.unpack_from(f"<{ndim}q", body, 8 * ndim)
            (offset,) = struct.unpack_from("<q", body, 16 * ndim)
            out[int(record[0])] = LazyTensor(storages[str(record[1])], offset, tuple(sizes), tuple(strides))
        return out

    def object(self, tensors: dict[int, LazyTensor]) -> Any:
        def persistent_load(saved_id: Any) -> Any:
            if isinstance(saved_id, tuple):
                return saved_id[0]  # a module class with its source: the placeholder class itself
            try:
                return tensors[int(saved_id)]
            except (KeyError, ValueError, TypeError):
                raise InputError(f"the pickle names tensor {saved_id!r}, which the tar does not hold",
                                 self.path) from None

        stream, _ = self._stream("pickle")
        return self._load(stream, "pickle", persistent_load)


READER = FormatReader(Format.TORCH_TAR, read_legacy_tar, unsafe_load=True,
                      weights_only_container=wo_input.TAR)
