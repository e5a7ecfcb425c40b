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
from ...format_names import Format
from ...io import paths, read_pickle_file
from ...limits import DEFAULT_LIMITS, Limits
from ...model import GlobalRef, StorageRef, TensorMeta, contiguous_strides
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import DTypeRef, Placeholder, restricted_loads
from ..interface import FormatReader, Loaded, ReadOptions
from .items import BytesItem, nest
from .stream import Chunk, DcpStreamSource

METADATA = ".metadata"


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
    for key, entry in sdm.items():
        fqn = str(key)
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
    metadata: dict[str, Any] = {"shards": sorted(shards)}
    version = attrs.get("version")
    if version is not None:
        metadata["dcp_version"] = str(version)
    loaded = Loaded(Format.DCP, nest(flat, attrs.get("planner_data")), tuple(references), tuple(warnings), (source,),
                    metadata=metadata, deferred=any(isinstance(v, BytesItem) for v in flat.values()))
    if _may_be_megatron(folder, flat) and paths.isfile(paths.join(folder, "metadata.json")):  # common.pt beside it
        from ..megatron import describe

        return describe(loaded, folder, options)
    return loaded


_MEGATRON_ROOTS = ("decoder.", "encoder.", "embedding.", "output_layer.", "model.decoder.", "model.embedding.")


def _may_be_megatron(folder: str, flat: dict[str, Any]) -> bool:
    """Whether to look for Megatron-core's metadata.json: always on a local disk (free); over a URL (a
    request each time) only when the keys are Megatron's, so that a plain DCP folder stays one request."""
    if not paths.is_url(folder):
        return True
    return any(k.startswith(_MEGATRON_ROOTS) for k in flat)


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
            why = paths.outside_folder(paths.dirname(meta_path), rel)
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
        # TensorProperties.__getstate__: (dtype, layout, requires_grad, ...)
        dtype_ref = state[0] if isinstance(state, tuple) and state else props.attributes.get("dtype")
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
                        for o, s, d in zip(offsets, sizes, shape, strict=True))):
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


READER = FormatReader(Format.DCP, read_dcp, weights_only_container=wo_input.OTHER, weights_only_note=(
    "a torch.distributed.checkpoint folder: torch.distributed.checkpoint.load reads it, not torch.load"))
