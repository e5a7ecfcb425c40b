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
from ...io.bytesource import ByteSource
from ...io.paths import open_bytes
from ...io.source import BlobSource, storage_source
from ...limits import Limits
from ...model import DataSource, GlobalRef
from ...pickles.unpickle.placeholders import LazyStorage, Placeholder, StorageType
from ...pickles.unpickle.unpickler import BlobReader, restricted_load_stream
from ...pickles.weights_only import inputs as wo_input
from ..checkpoint.loaded import Loaded, ReadOptions

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
    __slots__ = ("key", "itemsize", "numel", "storage")

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
    label = f"{where}: " if where else ""
    roots: dict[str, _Root] = {}
    views: dict[str, tuple[str, int, int, LazyStorage]] = {}
    class_sources: dict[str, str] = {}
    regions: dict[str, tuple[int, int]] = {}

    def persistent_load(pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid:
            raise InputError(f"{label}unexpected persistent id {str(pid)[:60]!r} in the legacy pickle", path)
        kind = _decode(pid[0])
        if kind == "module":
            # ("module", class, source_file, source): torch.save(model) names each module class once
            module_pids.append(kind)
            cls = pid[1] if len(pid) > 1 else None
            if isinstance(cls, type) and issubclass(cls, Placeholder) and len(pid) > 2 and pid[2]:
                class_sources[f"{cls._ckpt_module}.{cls._ckpt_name}"] = _decode(pid[2])
            return cls
        if kind != "storage" or len(pid) != 6:
            raise InputError(f"{label}unexpected persistent id kind {kind[:40]!r} in the legacy pickle", path)
        storage_type, root_key, location, numel, view = pid[1:]
        root_key = _decode(root_key)
        if not isinstance(storage_type, StorageType):
            raise InputError(f"{label}storage {root_key!r} has an unknown storage type", path)
        if type(numel) is not int or numel < 0:
            raise InputError(f"{label}storage {root_key!r} has an invalid size", path)
        dt = storage_type.dtype or _UINT8
        root = roots.get(root_key)
        if root is None:
            storage = LazyStorage(root_key, dt, numel * dt.itemsize, _decode(location), source)
            root = roots[root_key] = _Root(root_key, dt.itemsize, numel, storage)
        if view is None:
            return root.storage
        if not (isinstance(view, tuple) and len(view) == 3 and type(view[1]) is int and type(view[2]) is int
                and view[1] >= 0 and view[2] >= 0):
            raise InputError(f"{label}storage {root_key!r} has an invalid view record", path)
        view_key = "view:" + _decode(view[0])
        found = views.get(view_key)
        if found is None:
            offset, count = view[1], view[2]
            if (offset + count) * dt.itemsize > root.numel * root.itemsize:
                raise InputError(f"{label}a view of storage {root_key!r} reaches past its end", path)
            lazy = LazyStorage(view_key, dt, count * dt.itemsize, _decode(location), source)
            found = views[view_key] = (root_key, offset * dt.itemsize, count * dt.itemsize, lazy)
        return found[3]

    refs: list[GlobalRef] = []
    module_pids: list[str] = []
    pickles: list[wo_input.PickleRecord] = []

    def load(what: str, persistent: Callable[[Any], Any] | None = None) -> Any:
        if consumed() >= size and stream.tell() >= size:
            raise InputError(f"{label}truncated legacy torch checkpoint: the file ends before the {what}", path)
        seen: set[int] = set()
        try:
            result = restricted_load_stream(stream, where=f"{where} {what}".strip(), path=path,
                                            persistent_load=persistent, limits=limits, read_blob=read_blob,
                                            opcodes=seen)
        except LimitExceeded:
            raise
        except InputError as exc:
            if "truncated" in exc.message and consumed() >= bound:
                if bound < size:
                    raise LimitExceeded(
                        f"{label}the legacy pickles are over the pickle limit of {limits.max_pickle_bytes} "
                        "bytes (raise it with --max-pickle-bytes)", path,
                    ) from None
                raise InputError(f"{label}truncated legacy torch checkpoint: the file ends inside the {what}",
                                 path) from None
            raise
        for ref in result.references:
            if all((r.module, r.name) != (ref.module, ref.name) for r in refs):
                refs.append(ref)
        pickles.append((result.data, seen, result.references, f"{where} {what}".strip(),
                        module_pids if persistent is not None else []))
        return result.obj

    magic = load("magic number")
    if type(magic) is not int or magic != MAGIC_NUMBER:
        raise InputError(f"{label}not a legacy torch checkpoint: bad magic number", path)
    protocol = load("protocol version")
    if protocol != PROTOCOL_VERSION:
        raise InputError(f"{label}unsupported legacy torch protocol version {protocol!r} (expected 1001)", path)
    sys_info = load("sys_info record")
    root_obj = load("main pickle", persistent_load)
    keys = load("list of storage keys")
    if not isinstance(keys, list):
        raise InputError(f"{label}the list of storage keys is not a list", path)
    if len(keys) > limits.max_tensors:
        raise LimitExceeded(f"{label}{len(keys)} storages, over the limit of {limits.max_tensors} "
                            "(raise it with --max-tensors)", path)

    pos = stream.tell()
    if prefetch is not None:  # a URL: every storage's 8-byte count, where the pickle says it is, at once
        at, guesses = pos, []
        for raw_key in keys:
            root = roots.get(_decode(raw_key))
            if root is None or at + 8 > size:
                break
            guesses.append((at, 8))
            at += 8 + root.numel * root.itemsize
        prefetch(guesses)
    for i, raw_key in enumerate(keys):
        key = _decode(raw_key)
        root = roots.get(key)
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
        regions[key] = (start, nbytes)
        pos = start + nbytes
    missing = [k for k in roots if k not in regions]
    if missing:
        raise InputError(
            f"{label}storage {missing[0]!r} is used by the pickle but has no data in the file"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), path,
        )
    for view_key, (root_key, off, nbytes, _lazy) in views.items():
        start, _ = regions[root_key]
        regions[view_key] = (start + off, nbytes)
    warnings = []
    if pos < size:
        warnings.append(f"{size - pos} bytes after the last storage were not read (appended data?)")
    return LegacyParse(root_obj, refs, regions, warnings, sys_info, class_sources, pickles)


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
    loaded = Loaded(Format.TORCH_LEGACY, parsed.root, parsed.references, parsed.warnings, [source])
    loaded.weights_only = wo_input.read(wo_input.LEGACY, path, parsed.weights_only)
    if parsed.class_sources:
        loaded.metadata["module_class_sources"] = dict(parsed.class_sources)
    return loaded


def parse_legacy_bytes(blob: bytes, *, path: str, where: str, limits: Limits,
                       read_blob: BlobReader | None = None) -> LegacyParse:
    """A legacy blob held in memory (``torch.storage._load_from_bytes``)."""

    regions: dict[str, tuple[int, int]] = {}
    source = BlobSource(path, blob, lambda key: _region(regions, key, path))
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
