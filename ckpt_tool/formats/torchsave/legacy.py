"""Legacy (pre-1.6, non-zip) torch.save files, read lazily.

Layout, as ``torch.serialization._legacy_save`` writes it: five pickles one
after another (magic number, protocol version, sys_info, the object, the
sorted list of storage keys), then for each key an 8-byte little-endian
element count followed by the storage's bytes. The pickles are read with the
restricted unpickler; each storage is only *located* (offset, length) by
reading its 8-byte count and seeking past its bytes, so inspect reads no
tensor data however large the file is.
"""
from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import dtypes
from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io import ByteSource, BytesStorageSource, open_bytes, storage_source
from ...limits import Limits
from ...model import DataSource, GlobalRef
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import BlobReader, LazyStorage, Placeholder, StorageType, restricted_load_stream
from ..interface import FormatReader, Loaded, ReadOptions

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
_UINT8 = dtypes.BY_NAME["uint8"]
_COUNT = struct.Struct("<q")


@dataclass
class LegacyParse:
    """What a legacy blob holds, with every storage located but none read."""

    root: Any
    references: list[GlobalRef]
    regions: dict[str, tuple[int, int]]  # storage (or view) key -> (absolute offset, bytes)
    warnings: list[str] = field(default_factory=list)
    sys_info: Any = None
    class_sources: dict[str, str] = field(default_factory=dict)  # pickled nn.Module class -> its source file
    weights_only: list[wo_input.PickleRecord] = field(default_factory=list)  # per pickle, for wo_input.read


class _Root:
    __slots__ = ("itemsize", "key", "numel", "storage")

    def __init__(self, key: str, itemsize: int, numel: int, storage: LazyStorage) -> None:
        self.key = key
        self.itemsize = itemsize
        self.numel = numel
        self.storage = storage


class _RegionReader(io.RawIOBase):
    """A raw, read-only view of bytes [0, end) of a file or URL, read by range.

    Bounding the stream bounds how much pickle the unpickler can consume.
    """

    def __init__(self, data: ByteSource, end: int) -> None:
        super().__init__()
        self._data = data
        self.end = end
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True  # BufferedReader.tell() needs it; we only ever seek within [0, end]

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.end}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.end - self.pos)
        if want <= 0:
            return 0
        data = self._data.read_some(self.pos, want)
        n = len(data)
        buffer[:n] = data
        self.pos += n
        return n


def _decode(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def parse_legacy(
    stream: Any,
    size: int,
    pread: Callable[[int, int], bytes],
    *,
    path: str,
    where: str,
    source: DataSource,
    limits: Limits,
    consumed: Callable[[], int],
    bound: int,
    read_blob: BlobReader | None = None,
    prefetch: Callable[[list[tuple[int, int]]], None] | None = None,
) -> LegacyParse:
    """Parse a legacy blob from ``stream`` (positioned at 0), locating its storages.

    ``pread(offset, n)`` reads the 8-byte counts; ``consumed()`` says how far
    the stream has been read from its source, to tell truncation from a
    pickle that is merely over ``bound`` (the pickle limit).
    """
    parser = _LegacyParser(stream, size, path=path, where=where, source=source, limits=limits,
                           consumed=consumed, bound=bound, read_blob=read_blob)
    magic = parser.load("magic number")
    if type(magic) is not int or magic != MAGIC_NUMBER:
        raise InputError(f"{parser.label}not a legacy torch checkpoint: bad magic number", path)
    protocol = parser.load("protocol version")
    if protocol != PROTOCOL_VERSION:
        raise InputError(f"{parser.label}unsupported legacy torch protocol version {protocol!r} (expected 1001)",
                         path)
    sys_info = parser.load("sys_info record")
    root_obj = parser.load("main pickle", parser.persistent_load)
    keys = parser.storage_keys()
    pos = stream.tell()
    if prefetch is not None:  # a URL: every storage's 8-byte count, where the pickle says it is, at once
        prefetch(parser.count_ranges(keys, pos))
    pos = parser.locate(keys, pos, pread)
    warnings = []
    if pos < size:
        warnings.append(f"{size - pos} bytes after the last storage were not read (appended data?)")
    return LegacyParse(root_obj, parser.refs, parser.regions, warnings, sys_info, parser.class_sources,
                       parser.pickles)


class _LegacyParser:
    """The steps of parse_legacy over one blob: its five pickles, then where each storage's bytes lie."""

    def __init__(self, stream: Any, size: int, *, path: str, where: str, source: DataSource, limits: Limits,
                 consumed: Callable[[], int], bound: int, read_blob: BlobReader | None) -> None:
        self.stream, self.size, self.path, self.where = stream, size, path, where
        self.source, self.limits, self.consumed, self.bound, self.read_blob = source, limits, consumed, bound, read_blob
        self.label = f"{where}: " if where else ""
        self.roots: dict[str, _Root] = {}
        self.views: dict[str, tuple[str, int, int, LazyStorage]] = {}
        self.class_sources: dict[str, str] = {}
        self.regions: dict[str, tuple[int, int]] = {}
        self.refs: list[GlobalRef] = []
        self.module_pids: list[str] = []
        self.pickles: list[wo_input.PickleRecord] = []

    # -- the pickles ---------------------------------------------------------------
    def load(self, what: str, persistent: Callable[[Any], Any] | None = None) -> Any:
        """The next pickle of the stream (``what`` names it in errors), its globals and facts recorded."""
        label, path = self.label, self.path
        if self.consumed() >= self.size and self.stream.tell() >= self.size:
            raise InputError(f"{label}truncated legacy torch checkpoint: the file ends before the {what}", path)
        seen: set[int] = set()
        try:
            result = restricted_load_stream(self.stream, where=f"{self.where} {what}".strip(), path=path,
                                            persistent_load=persistent, limits=self.limits,
                                            read_blob=self.read_blob, opcodes=seen)
        except LimitExceeded:
            raise
        except InputError as exc:
            if "truncated" in exc.message and self.consumed() >= self.bound:
                if self.bound < self.size:
                    raise LimitExceeded(
                        f"{label}the legacy pickles are over the pickle limit of {self.limits.max_pickle_bytes} "
                        "bytes (raise it with --max-pickle-bytes)", path,
                    ) from None
                raise InputError(f"{label}truncated legacy torch checkpoint: the file ends inside the {what}",
                                 path) from None
            raise
        for ref in result.references:
            if all((r.module, r.name) != (ref.module, ref.name) for r in self.refs):
                self.refs.append(ref)
        self.pickles.append((result.data, seen, result.references, f"{self.where} {what}".strip(),
                             self.module_pids if persistent is not None else []))
        return result.obj

    def persistent_load(self, pid: Any) -> Any:
        """The main pickle's persistent ids: a module class's source, or a storage (or a view of one)."""
        label, path = self.label, self.path
        if not isinstance(pid, tuple) or not pid:
            raise InputError(f"{label}unexpected persistent id {str(pid)[:60]!r} in the legacy pickle", path)
        kind = _decode(pid[0])
        if kind == "module":
            # ("module", class, source_file, source): torch.save(model) names each module class once
            self.module_pids.append(kind)
            cls = pid[1] if len(pid) > 1 else None
            if isinstance(cls, type) and issubclass(cls, Placeholder) and len(pid) > 2 and pid[2]:
                self.class_sources[f"{cls._ckpt_module}.{cls._ckpt_name}"] = _decode(pid[2])
            return cls
        if kind != "storage" or len(pid) != 6:
            raise InputError(f"{label}unexpected persistent id kind {kind[:40]!r} in the legacy pickle", path)
        storage_type, raw_key, location, numel, view = pid[1:]
        root, dt = self._root(storage_type, _decode(raw_key), location, numel)
        if view is None:
            return root.storage
        return self._view(root, dt, view, location)

    def _root(self, storage_type: object, root_key: str, location: object, numel: object
              ) -> tuple[_Root, dtypes.DType]:
        """The storage a persistent id names (made on its first mention), and the dtype this id gives it."""
        label, path = self.label, self.path
        if not isinstance(storage_type, StorageType):
            raise InputError(f"{label}storage {root_key!r} has an unknown storage type", path)
        if type(numel) is not int or numel < 0:
            raise InputError(f"{label}storage {root_key!r} has an invalid size", path)
        dt = storage_type.dtype or _UINT8
        root = self.roots.get(root_key)
        if root is None:
            storage = LazyStorage(root_key, dt, numel * dt.itemsize, _decode(location), self.source)
            root = self.roots[root_key] = _Root(root_key, dt.itemsize, numel, storage)
        return root, dt

    def _view(self, root: _Root, dt: dtypes.DType, view: object, location: object) -> LazyStorage:
        """A view record (key, element offset, element count) of storage ``root``."""
        label, path, root_key = self.label, self.path, root.key
        if not (isinstance(view, tuple) and len(view) == 3 and type(view[1]) is int and type(view[2]) is int
                and view[1] >= 0 and view[2] >= 0):
            raise InputError(f"{label}storage {root_key!r} has an invalid view record", path)
        view_key = "view:" + _decode(view[0])
        found = self.views.get(view_key)
        if found is None:
            offset, count = view[1], view[2]
            if (offset + count) * dt.itemsize > root.numel * root.itemsize:
                raise InputError(f"{label}a view of storage {root_key!r} reaches past its end", path)
            lazy = LazyStorage(view_key, dt, count * dt.itemsize, _decode(location), self.source)
            found = self.views[view_key] = (root_key, offset * dt.itemsize, count * dt.itemsize, lazy)
        return found[3]

    # -- the storages --------------------------------------------------------------
    def storage_keys(self) -> list[Any]:
        """The fifth pickle: the storage keys, in the order their bytes follow."""
        keys = self.load("list of storage keys")
        if not isinstance(keys, list):
            raise InputError(f"{self.label}the list of storage keys is not a list", self.path)
        if len(keys) > self.limits.max_tensors:
            raise LimitExceeded(f"{self.label}{len(keys)} storages, over the limit of {self.limits.max_tensors} "
                                "(raise it with --max-tensors)", self.path)
        return keys

    def count_ranges(self, keys: list[Any], pos: int) -> list[tuple[int, int]]:
        """Where each storage's 8-byte count is, if every storage is as large as the pickle says."""
        at, guesses = pos, []
        for raw_key in keys:
            root = self.roots.get(_decode(raw_key))
            if root is None or at + 8 > self.size:
                break
            guesses.append((at, 8))
            at += 8 + root.numel * root.itemsize
        return guesses

    def locate(self, keys: list[Any], pos: int, pread: Callable[[int, int], bytes]) -> int:
        """Record each storage's (and view's) byte range from ``pos`` on; returns where the last one ends."""
        label, path, size = self.label, self.path, self.size
        for i, raw_key in enumerate(keys):
            key = _decode(raw_key)
            root = self.roots.get(key)
            if root is None:
                raise InputError(f"{label}the storage list names {key!r}, which the main pickle never uses", path)
            head = pread(pos, 8) if pos + 8 <= size else b""
            if len(head) < 8:
                raise InputError(
                    f"{label}truncated legacy torch checkpoint: the file ends before storage {key!r} "
                    f"({i + 1} of {len(keys)}) at byte {pos}", path,
                )
            (count,) = _COUNT.unpack(head)
            if count != root.numel:
                raise InputError(
                    f"{label}storage {key!r} records {count} elements but the pickle says {root.numel}", path
                )
            nbytes = count * root.itemsize
            start = pos + 8
            if start + nbytes > size:
                raise InputError(
                    f"{label}truncated legacy torch checkpoint: storage {key!r} ({i + 1} of {len(keys)}) needs "
                    f"{nbytes} bytes at offset {start} but the file ends at {size}", path,
                )
            self.regions[key] = (start, nbytes)
            pos = start + nbytes
        missing = [k for k in self.roots if k not in self.regions]
        if missing:
            raise InputError(
                f"{label}storage {missing[0]!r} is used by the pickle but has no data in the file"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), path,
            )
        for view_key, (root_key, off, nbytes, _lazy) in self.views.items():
            start, _ = self.regions[root_key]
            self.regions[view_key] = (start + off, nbytes)
        return pos


def read_legacy(path: str, options: ReadOptions) -> Loaded:
    """A legacy torch.save file: pickles parsed, storages located by seeking."""
    data = open_bytes(path)
    try:
        size = data.size
        bound = min(size, options.limits.max_pickle_bytes)
        raw = _RegionReader(data, bound)
        stream = io.BufferedReader(raw, buffer_size=1 << 16)
        regions: dict[str, tuple[int, int]] = {}
        source = storage_source(path, lambda key: _region(regions, key, path), data=data)

        parsed = parse_legacy(stream, size, data.read_upto, path=path, where="", source=source,
                              limits=options.limits, consumed=lambda: raw.pos, bound=bound,
                              read_blob=options.read_blob, prefetch=data.prefetch if data.remote else None)
        regions.update(parsed.regions)
    finally:
        data.close()
    return Loaded(Format.TORCH_LEGACY, parsed.root, tuple(parsed.references), tuple(parsed.warnings), (source,),
                  metadata={"module_class_sources": dict(parsed.class_sources)} if parsed.class_sources else {},
                  weights_only=wo_input.read(wo_input.LEGACY, path, parsed.weights_only))


def parse_legacy_bytes(blob: bytes, *, path: str, where: str, limits: Limits,
                       read_blob: BlobReader | None = None) -> LegacyParse:
    """A legacy blob held in memory (``torch.storage._load_from_bytes``)."""

    regions: dict[str, tuple[int, int]] = {}
    source = BytesStorageSource(path, blob, lambda key: _region(regions, key, path))
    stream = io.BytesIO(blob)
    size = len(blob)

    def pread(offset: int, n: int) -> bytes:
        return blob[offset : offset + n]

    parsed = parse_legacy(stream, size, pread, path=path, where=where, source=source, limits=limits,
                          consumed=stream.tell, bound=size, read_blob=read_blob)
    regions.update(parsed.regions)
    return parsed


def _region(regions: dict[str, tuple[int, int]], key: str, path: str) -> tuple[int, int]:
    found = regions.get(key)
    if found is None:
        raise InputError(f"storage {key!r} is not in the file", path)
    return found


READER = FormatReader(Format.TORCH_LEGACY, read_legacy, unsafe_load=True)
