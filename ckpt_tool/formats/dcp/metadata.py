"""torch.distributed.checkpoint (DCP) folders, listed from ``.metadata`` alone.

``.metadata`` is a pickle of DCP's dataclasses (torch's own reader uses plain
``pickle.load``); here the restricted unpickler reads them as placeholders.
Keys, shapes and dtypes come from ``state_dict_metadata``; non-tensor entries
(bytes items) are metadata left unread (dcp_items.BytesItem: read by the data
paths, never by a metadata answer); the nesting of the
original state_dict is rebuilt from ``planner_data``. Shard files are only
checked to exist: tensor bytes are read (chunk by chunk, each chunk a
torch.save blob parsed by ckpt's own zip reader) only when data is needed.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ... import dtypes
from ...errors import CkptError, InputError
from ...io import paths
from ...io.bytesource import ByteSource
from ...io.source import read_pickle_file
from ...limits import DEFAULT_LIMITS, Limits
from ...model import DataSource, GlobalRef, StorageRef, TensorMeta, contiguous_strides
from ...pickles.unpickle.placeholders import DTypeRef, Placeholder
from ...pickles.unpickle.unpickler import restricted_loads
from ...tensors.numpy_reads import c_order_bytes
from ..checkpoint.loaded import Loaded, ReadOptions
from ..detect import DCP
from ..hf.index import outside_folder
from .items import BytesItem, nest
from .stream import DcpStreamSource

METADATA = ".metadata"


@dataclass(frozen=True)
class Chunk:
    """One saved piece of a tensor: where it sits in the tensor and in which file."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


def read_dcp(path: str, options: ReadOptions) -> Loaded:
    """A DCP folder (or its ``.metadata`` file): every key, shape and dtype, no shard opened."""
    explicit = not paths.isdir(path)
    folder = paths.dirname(path) if explicit else path
    meta_path = path if explicit else paths.join(path, METADATA)
    attrs, references = load_metadata(meta_path, options.limits)
    sdm = attrs["state_dict_metadata"]
    chunks_by_key, shards = _storage_index(attrs.get("storage_data"), meta_path)
    warnings: list[str] = []
    _check_shards(folder, shards, explicit, warnings)
    source = DcpStreamSource(folder, options.limits)
    flat: OrderedDict[str, Any] = OrderedDict()
    for fqn, entry in sdm.items():
        fqn = str(fqn)
        kind = entry.qualname.rsplit(".", 1)[-1] if isinstance(entry, Placeholder) else type(entry).__name__
        if kind == "TensorStorageMetadata":
            meta = _tensor_meta(fqn, entry, chunks_by_key.get(fqn, []), source, warnings, meta_path)
            if meta is not None:
                flat[fqn] = meta
        elif kind == "BytesStorageMetadata":
            where = chunks_by_key.get(fqn, [])
            # left in its shard file: the data paths read it (formats/dcp/deferred.py), a metadata answer does not
            flat[fqn] = BytesItem(folder, where[0].relative_path, where[0].offset, where[0].length,
                                  where[0].transforms, fqn, options.limits) if where else "<bytes item, not read>"
        else:
            warnings.append(f"entry {fqn!r} has an unknown DCP storage type {kind!r}; not listed")
    loaded = Loaded(DCP, nest(flat, attrs.get("planner_data")), references, warnings, [source])
    loaded.deferred = any(isinstance(v, BytesItem) for v in flat.values())
    loaded.metadata["shards"] = sorted(shards)
    version = attrs.get("version")
    if version is not None:
        loaded.metadata["dcp_version"] = str(version)
    return loaded


def load_metadata(meta_path: str, limits: Limits) -> tuple[dict[str, Any], list[GlobalRef]]:
    """The one parse of a ``.metadata`` file (restricted unpickler): Metadata's attributes, and its globals."""
    data = read_pickle_file(meta_path, limits.max_pickle_bytes, ".metadata")
    if not data:
        raise InputError("empty .metadata file (the save did not finish?)", meta_path)
    result = restricted_loads(data, where=".metadata", path=meta_path, limits=limits)
    md = result.obj
    attrs = md.attributes if isinstance(md, Placeholder) else {}
    if not isinstance(attrs.get("state_dict_metadata"), dict):
        raise InputError(".metadata does not hold torch.distributed.checkpoint Metadata", meta_path)
    return attrs, list(result.references)


def _storage_index(storage_data: Any, meta_path: str) -> tuple[dict[str, list[Chunk]], set[str]]:
    """fqn -> its chunks (from MetadataIndex -> _StorageInfo), and every shard file named."""
    by_key: dict[str, list[Chunk]] = {}
    shards: set[str] = set()
    checked: set[str] = set()
    if not isinstance(storage_data, dict):
        return by_key, shards
    for index, info in storage_data.items():
        ia = index.attributes if isinstance(index, Placeholder) else {}
        sa = info.attributes if isinstance(info, Placeholder) else {}
        fqn, rel = ia.get("fqn"), sa.get("relative_path")
        offset, length = sa.get("offset"), sa.get("length")
        if not isinstance(fqn, str) or not isinstance(rel, str) or type(offset) is not int \
                or type(length) is not int or offset < 0 or length < 0:
            raise InputError(".metadata has a malformed storage entry", meta_path)
        norm = os.path.normpath(rel) if rel else rel
        if rel not in checked:
            checked.add(rel)
            why = outside_folder(paths.dirname(meta_path), rel)
            if why:
                raise InputError(f".metadata names shard {rel!r}, which {why.replace('points', 'is')}", meta_path)
        transforms = sa.get("transform_descriptors") or ()
        offsets = ia.get("offset")
        by_key.setdefault(fqn, []).append(Chunk(
            tuple(offsets) if isinstance(offsets, tuple) else (), (), norm, offset, length,
            tuple(str(t) for t in transforms) if isinstance(transforms, (list, tuple)) else (str(transforms),),
        ))
        shards.add(norm)
    return by_key, shards


def _check_shards(folder: str, shards: set[str], explicit: bool, warnings: list[str]) -> None:
    """A partial set of shards is an error; none at all is a metadata-only copy (a warning)."""
    missing = sorted(paths.missing_files(folder, sorted(shards)))
    if not missing:
        return
    shown = ", ".join(repr(m) for m in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    if len(missing) == len(shards) or explicit:
        warnings.append(
            f"metadata only: shard file(s) {shown} are not present, so tensor data cannot be read "
            "(keys, shapes and dtypes come from .metadata)"
        )
        return
    raise InputError(
        f"shard file {shown} is missing ({len(missing)} of {len(shards)} shards): the checkpoint is incomplete; "
        f"to list what .metadata describes anyway, run `ckpt inspect {paths.join(folder, METADATA)}`",
        folder,
    )


def _tensor_meta(fqn: str, entry: Placeholder, chunks: list[Chunk], source: DcpStreamSource,
                 warnings: list[str], meta_path: str) -> TensorMeta | None:
    attrs = entry.attributes
    props = attrs.get("properties")
    dtype_ref = None
    if isinstance(props, Placeholder):
        state = props.state
        if isinstance(state, tuple) and state:
            dtype_ref = state[0]  # TensorProperties.__getstate__: (dtype, layout, requires_grad, ...)
        else:
            dtype_ref = props.attributes.get("dtype")
    name = dtype_ref.name if isinstance(dtype_ref, DTypeRef) else None
    if name is None or name not in dtypes.BY_NAME:
        warnings.append(f"tensor {fqn!r} has a dtype ckpt does not know ({getattr(dtype_ref, 'name', dtype_ref)!r}); "
                        "not listed")
        return None
    shape = attrs.get("size")
    if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
        raise InputError(f".metadata gives tensor {fqn!r} an invalid size", meta_path)
    placed = []
    for ch in attrs.get("chunks") or []:
        ca = ch.attributes if isinstance(ch, Placeholder) else {}
        offsets, sizes = ca.get("offsets"), ca.get("sizes")
        if not (isinstance(offsets, tuple) and isinstance(sizes, tuple) and len(offsets) == len(shape)
                and len(sizes) == len(shape)
                and all(type(o) is int and type(s) is int and o >= 0 and s >= 0 and o + s <= d
                        for o, s, d in zip(offsets, sizes, shape))):
            raise InputError(f".metadata gives tensor {fqn!r} a chunk outside its shape", meta_path)
        stored = next((c for c in chunks if c.offsets == offsets), None)
        if stored is None:
            raise InputError(f".metadata has no storage entry for a chunk of tensor {fqn!r}", meta_path)
        placed.append(Chunk(offsets, sizes, stored.relative_path, stored.offset, stored.length, stored.transforms))
    dt = dtypes.BY_NAME[name]
    numel = 1
    for d in shape:
        numel *= d
    source.add(fqn, dt, shape, placed)
    return TensorMeta(fqn, name, shape, contiguous_strides(shape), 0,
                      StorageRef(source, fqn, numel * dt.itemsize), "cpu")


class DcpSource(DataSource):
    """Tensor bytes of a DCP folder, assembled from the chunks that hold them."""

    def __init__(self, folder: str, limits: Limits) -> None:
        self.path = folder
        self.limits = limits
        self._tensors: dict[str, tuple[dtypes.DType, tuple[int, ...], list[Chunk]]] = {}
        self._last: tuple[str, bytes] | None = None

    def add(self, key: str, dt: dtypes.DType, shape: tuple[int, ...], chunks: list[Chunk]) -> None:
        self._tensors[key] = (dt, shape, chunks)

    def read(self, key: str, offset: int, length: int) -> bytes:
        if self._last is None or self._last[0] != key:
            self._last = (key, self._assemble(key))
        data = self._last[1]
        if offset < 0 or length < 0 or offset + length > len(data):
            raise InputError(f"tensor {key!r} holds {len(data)} bytes, not {offset + length}", self.path)
        return data[offset : offset + length]

    def _assemble(self, key: str) -> bytes:
        dt, shape, chunks = self._tensors[key]
        itemsize = dt.itemsize
        numel = 1
        for d in shape:
            numel *= d
        total = numel * itemsize
        if len(chunks) == 1 and all(o == 0 for o in chunks[0].offsets) and chunks[0].sizes == shape:
            return self._chunk_bytes(key, dt, chunks[0])
        covered = sum(_prod(c.sizes) for c in chunks)
        if covered != numel:
            raise InputError(f"the chunks of tensor {key!r} cover {covered} of its {numel} elements", self.path)
        stored = sum(c.length for c in chunks)
        if stored < total:  # checked before allocating: the sizes come from .metadata
            raise InputError(f"the chunks of tensor {key!r} hold {stored} bytes, fewer than its {total}", self.path)
        for c in chunks:  # and the lengths themselves must be bytes that exist
            size = self._file(c.relative_path, key).size
            if c.offset + c.length > size:
                raise InputError(f"a chunk of tensor {key!r} lies past the end of {c.relative_path!r} "
                                 f"({c.offset + c.length} > {size} bytes)", self.path)
        out = bytearray(total)
        for chunk in chunks:
            _place(out, self._chunk_bytes(key, dt, chunk), shape, chunk, itemsize)
        return bytes(out)

    def _file(self, relative: str, key: str) -> ByteSource:
        """A shard file, opened (a missing one named with the tensor that needs it)."""
        file = paths.join(self.path, relative)
        try:
            return paths.open_bytes(file)
        except InputError as exc:
            if getattr(exc, "kind", "missing") != "missing" or (not paths.is_url(file) and os.path.exists(file)):
                raise
            raise InputError(f"shard file {relative!r} is missing: tensor {key!r} cannot be read",
                             self.path) from None

    def _chunk_bytes(self, key: str, dt: dtypes.DType, chunk: Chunk) -> bytes:
        """One chunk's elements in C order, from the torch.save blob (or raw bytes) that holds it."""
        file = paths.join(self.path, chunk.relative_path)
        data = self._file(chunk.relative_path, key)
        if chunk.transforms:
            raise InputError(
                f"tensor {key!r} is stored with DCP transforms {list(chunk.transforms)} (compression?), "
                "which ckpt cannot read", self.path,
            )
        try:
            blob = data.read(chunk.offset, chunk.length)
        finally:
            data.close()
        want = _prod(chunk.sizes) * dt.itemsize
        if not blob.startswith(b"PK\x03\x04"):
            if len(blob) == want:
                return blob  # raw tensor bytes (DCP's safetensors-style serialization)
            raise InputError(f"the chunk of tensor {key!r} in {chunk.relative_path!r} is not torch.save bytes",
                             self.path)
        return _blob_tensor_bytes(blob, key, dt, chunk, file, self.limits)


def _blob_tensor_bytes(blob: bytes, key: str, dt: dtypes.DType, chunk: Chunk, file: str, limits: Limits) -> bytes:
    from ...pickles import severity
    from ...pickles.unpickle.placeholders import LazyTensor
    from ..torchsave.inmemory import read_torch_blob

    where = f"chunk of tensor {key!r}"
    obj, refs = read_torch_blob(blob, path=file, where=where, limits=limits)
    unsafe = sorted({r.qualname for r in refs if r.severity != severity.SAFE})
    if unsafe:
        raise InputError(f"the {where} names {', '.join(unsafe[:3])}, not a plain tensor; refusing it", file)
    if not isinstance(obj, LazyTensor) or obj.storage is None:
        raise InputError(f"the {where} does not hold a tensor", file)
    if obj.dtype.name != dt.name or tuple(obj.shape) != chunk.sizes:
        raise InputError(
            f"the {where} holds {obj.dtype.name} {list(obj.shape)}, but .metadata says {dt.name} {list(chunk.sizes)}",
            file,
        )
    st = obj.storage
    meta = TensorMeta(key, dt.name, tuple(obj.shape), tuple(obj.stride), obj.storage_offset,
                      StorageRef(st.source, st.key, st.nbytes))
    if meta.numel and meta.byte_span[1] > st.nbytes:
        raise InputError(f"the {where} reaches past the end of its storage", file)
    return c_order_bytes(meta)


def _prod(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _place(out: bytearray, data: bytes, shape: tuple[int, ...], chunk: Chunk, itemsize: int) -> None:
    """Copy a chunk (C order) into the full tensor's bytes at its offsets, run by run."""
    sizes, offsets = chunk.sizes, chunk.offsets
    if len(data) != _prod(sizes) * itemsize:
        raise InputError("a chunk's bytes do not match its size")
    if not shape:
        out[:] = data
        return
    # trailing dimensions the chunk spans completely form one contiguous run
    k = len(shape) - 1
    while k > 0 and sizes[k] == shape[k] and offsets[k] == 0:
        k -= 1
    run = _prod(sizes[k:]) * itemsize
    full_strides = contiguous_strides(shape)
    outer = sizes[:k]
    index = [0] * k
    src = 0
    for _ in range(_prod(outer) if outer else 1):
        start = sum((offsets[d] + index[d]) * full_strides[d] for d in range(k)) + offsets[k] * full_strides[k]
        out[start * itemsize : start * itemsize + run] = data[src : src + run]
        src += run
        for d in range(k - 1, -1, -1):
            index[d] += 1
            if index[d] < outer[d]:
                break
            index[d] = 0


@dataclass(frozen=True)
class ItemRegion:
    """One item of a DCP data file: where torch.load will read it from."""

    fqn: str
    offset: int
    length: int
    is_bytes: bool  # a non-tensor item, loaded with torch.load(weights_only=False)
    transformed: bool  # compressed or otherwise transformed on save: its bytes are not a pickle


def dcp_regions(metadata_path: str, limits: Limits = DEFAULT_LIMITS) -> dict[str, list[ItemRegion]] | None:
    """The items of each ``.distcp`` file, from the same parse of ``.metadata`` the reader uses (None: unreadable)."""
    try:
        attrs, _ = load_metadata(metadata_path, limits)
        chunks, _ = _storage_index(attrs.get("storage_data"), metadata_path)
    except (OSError, CkptError):
        return None
    sdm = attrs["state_dict_metadata"]
    out: dict[str, list[ItemRegion]] = {}
    for fqn, items in chunks.items():
        entry = sdm.get(fqn)
        is_bytes = isinstance(entry, Placeholder) and entry._ckpt_name == "BytesStorageMetadata"
        for c in items:
            out.setdefault(c.relative_path, []).append(
                ItemRegion(fqn, c.offset, c.length, is_bytes, bool(c.transforms)))
    return out
