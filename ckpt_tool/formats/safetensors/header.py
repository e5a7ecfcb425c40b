"""safetensors: the JSON header alone, validated as strictly as the format demands."""
from __future__ import annotations

import json
import struct
from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from math import prod
from operator import itemgetter, mul, sub
from typing import Any

from ... import dtypes
from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io import dirname, open_bytes, storage_source
from ...model import StorageRef, TensorMeta
from ...pickles.torch_rules import inputs as wo_input
from ..detect import is_distributed_shard
from ..interface import FormatReader, Loaded, ReadOptions


class _Duplicates(dict):  # type: ignore[type-arg]
    """A JSON object as serde_json builds safetensors' header: the last duplicate tensor key wins
    (safetensors 0.8 accepts it), a duplicated ``__metadata__`` field is an error."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = _Duplicates()
    out.duplicates = []
    for k, v in pairs:
        if k in out:
            if k == "__metadata__":
                raise ValueError("duplicate field `__metadata__`")
            out.duplicates.append(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (safetensors' parser refuses it)")


def read_header(path: str, options: ReadOptions) -> tuple[dict[str, Any], int, int, list[str]]:
    """(parsed header, data start offset, data length, duplicated tensor keys)."""
    with open_bytes(path) as data:
        size = data.size
        if size < 8:
            raise InputError("truncated safetensors file: shorter than its 8-byte header length", path)
        (n,) = struct.unpack("<Q", data.read(0, 8))
        if n > options.limits.max_header_bytes:
            raise LimitExceeded(
                f"safetensors header claims {n} bytes, over the limit of "
                f"{options.limits.max_header_bytes} (raise it with --max-header-bytes)",
                path,
            )
        if n > size - 8:
            raise InputError(
                f"truncated safetensors file: header claims {n} bytes but only {size - 8} follow", path
            )
        raw = data.read(8, n)
    duplicates: list[str] = []
    try:
        text = raw.decode("utf-8")
        # serde_json's rules, which safetensors applies: no NaN/Infinity, no lone surrogates.
        header = json.loads(text, parse_constant=_no_constant)
        if "\\u" in text:
            json.dumps(header, ensure_ascii=False).encode("utf-8")  # lone surrogates raise here
        if isinstance(header, dict) and (text.count('"data_offsets"') > len(header)
                                         or text.count('"__metadata__"') > 1):
            # The slow hook-based parse runs only when counts hint at a duplicate key.
            header = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
            duplicates = header.duplicates
    except UnicodeEncodeError:
        raise InputError("bad safetensors header: invalid JSON (a lone surrogate escape, which "
                         "safetensors' parser refuses)", path) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: [[[[... nested
        raise InputError(f"bad safetensors header: invalid JSON ({exc})", path) from None
    if not isinstance(header, dict):
        raise InputError("bad safetensors header: not a JSON object", path)
    return header, 8 + n, size - 8 - n, sorted(set(duplicates))


def read_safetensors(path: str, options: ReadOptions) -> Loaded:
    header, start, data_len, duplicates = read_header(path, options)
    meta = header.pop("__metadata__", None)
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ):
        raise InputError("bad safetensors header: __metadata__ must map strings to strings", path)
    if len(header) > options.limits.max_tensors:
        raise LimitExceeded(f"safetensors header lists {len(header)} tensors, over the limit of "
                            f"{options.limits.max_tensors} (raise it with --max-tensors)", path)
    if isinstance(meta, dict) and "DCP_SHARDING_INFO" in meta and not options.part_as_saved \
            and is_distributed_shard(path, meta["DCP_SHARDING_INFO"]):
        raise InputError(shard_file_message(path), path)
    entries = checked_entries(header, data_len, options, path)
    source = storage_source(path, _regions(entries, start))
    entries.sort(key=_KEY)  # safetensors lists keys sorted (then this sort is linear)
    # stride None: safetensors tensors are always contiguous
    tensors = [TensorMeta(key, dt.name, shape, None, 0, StorageRef(source, key, end - begin), "cpu")
               for begin, end, key, dt, shape in entries]
    root: OrderedDict[str, TensorMeta] = OrderedDict(zip(map(_KEY, entries), tensors, strict=True))
    warnings = ("duplicate tensor keys in the header (the format forbids them; safetensors keeps the last, as "
                f"ckpt does): {', '.join(repr(k) for k in duplicates[:5])}",) if duplicates else ()
    if meta and restore_aliases(root, meta):
        tensors = list(root.values())
    return Loaded(Format.SAFETENSORS, root, warnings=warnings, sources=(source,), layout="state_dict",
                  metadata={"__metadata__": dict(meta)} if meta else {}, tensors=tuple(tensors))


def shard_file_message(path: str) -> str:
    """What a single rank file is, and the command that reads the whole save."""
    folder = dirname(path) or "."
    return ("one rank's file of a distributed safetensors save (torch.distributed.checkpoint's "
            "HuggingFaceStorageWriter(save_distributed=True)): it holds that rank's slices, placed by "
            "DCP_SHARDING_INFO, not whole tensors; the folder reads as the consolidated model: "
            f"`ckpt inspect {folder}`, `ckpt migrate {folder} -o model.safetensors`")


def _regions(entries: list[Entry], start: int) -> Callable[[str], tuple[int, int]]:
    """The resolver of a FileSource: key -> (absolute offset, length), indexed on the first data read.

    Metadata answers never read data: for them the index (200,000 entries in
    some files) is not built at all.
    """
    index: dict[str, tuple[int, int]] = {}

    def resolve(key: str) -> tuple[int, int]:
        if not index:
            index.update((e[2], (start + e[0], e[1] - e[0])) for e in entries)
        return index[key]

    return resolve


_KEY = itemgetter(2)
_INT = {int}
Entry = tuple[int, int, str, dtypes.DType, tuple[int, ...]]


def checked_entries(header: dict[str, Any], data_len: int, options: ReadOptions, path: str) -> list[Entry]:
    """(begin, end, key, dtype, shape) per tensor of a parsed header (``__metadata__`` popped), every check done.

    Offsets are relative to the data start; an error names the bad entry.
    """
    fast = _entries_fast(header, data_len, options.limits.max_key_length)
    return fast if fast is not None else _entries_checked(header, data_len, options, path)


def _entries_fast(header: dict[str, Any], data_len: int, max_key: int) -> list[Entry] | None:
    """(begin, end, key, dtype, shape) per tensor, validated with whole-column checks.

    A 200,000-tensor header is validated in C-speed passes; None means some
    check failed, and the entry-by-entry reader finds and names the culprit.
    """
    try:
        keys = list(header)
        infos = list(header.values())
        dts = [dtypes.BY_SAFETENSORS[i["dtype"]] for i in infos]
        shapes = [tuple(i["shape"]) for i in infos]
        offsets = [tuple(i["data_offsets"]) for i in infos]
    except (TypeError, KeyError, ValueError, AttributeError):
        return None  # malformed: the checked reader names the entry
    dims = list(chain.from_iterable(shapes))
    if (dims and (set(map(type, dims)) != _INT or min(dims) < 0)) or set(map(len, offsets)) - {2}:
        return None
    if any(dt.safetensors_per_item != 1 for dt in dts):  # F4 counts fp4 values: torch's shapes count bytes
        converted = [dtypes.torch_shape(dt, shape) for dt, shape in zip(dts, shapes, strict=True)]
        if None in converted:
            return None  # an odd number of fp4 values: the checked reader names the entry
        shapes = [shape for shape in converted if shape is not None]
    begins = [o[0] for o in offsets]
    ends = [o[1] for o in offsets]
    if keys and (set(map(type, begins)) != _INT or set(map(type, ends)) != _INT or min(begins) < 0):
        return None
    sizes = list(map(mul, map(prod, shapes), [dt.itemsize for dt in dts]))
    if list(map(sub, ends, begins)) != sizes:
        return None
    spans = sorted(zip(begins, ends, strict=True))
    # contiguous from 0 to the end of the data: no overlap, no gap, nothing past the end
    if spans and (spans[0][0] != 0 or spans[-1][1] != data_len
                  or [s[0] for s in spans[1:]] != [s[1] for s in spans[:-1]]):
        return None
    if keys and max(map(len, keys)) > max_key:
        return None
    return list(zip(begins, ends, keys, dts, shapes, strict=True))


def _entries_checked(header: dict[str, Any], data_len: int, options: ReadOptions, path: str) -> list[Entry]:
    """The same checks entry by entry, raising the error that names the bad tensor."""
    entries = []
    by_code = dtypes.BY_SAFETENSORS
    for key, info in header.items():
        try:
            dt = by_code[info["dtype"]]
            shape = tuple(info["shape"])
            begin, end = info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise InputError(
                f"bad safetensors header: entry {key!r} needs a known dtype, a shape and two data_offsets", path
            ) from None
        numel = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise InputError(f"bad safetensors header: tensor {key!r} has an invalid shape", path)
            numel *= d
        if dt.safetensors_per_item != 1:
            shape = _torch_shape(key, info["dtype"], dt, shape, path)
            numel //= dt.safetensors_per_item
        if type(begin) is not int or type(end) is not int or begin < 0 or end < begin:
            raise InputError(f"bad safetensors header: tensor {key!r} has invalid data_offsets", path)
        if end - begin != numel * dt.itemsize:
            raise InputError(
                f"bad safetensors header: tensor {key!r} is {dt.name}{list(shape)} ({numel * dt.itemsize} bytes) "
                f"but its offsets span {end - begin} bytes",
                path,
            )
        if end > data_len:
            raise InputError(
                f"bad safetensors header: tensor {key!r} ends at byte {end}, past the {data_len} data bytes "
                "(truncated file?)",
                path,
            )
        if len(key) > options.limits.max_key_length:
            raise LimitExceeded(f"tensor key {key[:40]!r}... is {len(key)} characters long, over the limit of "
                                f"{options.limits.max_key_length} (raise it with --max-key-length)", path)
        entries.append((begin, end, key, dt, shape))
    entries.sort(key=lambda e: (e[0], e[1]))
    cursor = 0
    for begin, end, key, _, _ in entries:
        if begin < cursor:
            raise InputError(f"bad safetensors header: tensor {key!r} overlaps the tensor before it", path)
        if begin > cursor:
            raise InputError(f"bad safetensors header: a gap of {begin - cursor} bytes before tensor {key!r}", path)
        cursor = end
    if cursor != data_len and entries:
        raise InputError(f"bad safetensors header: {data_len - cursor} trailing bytes after the last tensor", path)
    return entries


def restore_aliases(root: OrderedDict[str, TensorMeta], meta: dict[str, str]) -> bool:
    """Tied tensors are stored once; ``__metadata__`` maps each alias to the stored key.

    That is ``safetensors.torch.save_model``'s convention (and ckpt migrate's):
    the alias comes back as a second name for the same bytes, so the tie
    shows (shared storage) and a torch output keeps it.
    """
    added = False
    for alias, stored in meta.items():
        if alias != "format" and alias not in root and stored in root:
            t = root[stored]
            root[alias] = TensorMeta(alias, t.dtype, t.shape, t.stride, t.storage_offset, t.storage, t.device)
            added = True
    if added:
        items = sorted(root.items())
        root.clear()
        root.update(items)
    return added


def _torch_shape(key: str, code: str, dt: dtypes.DType, shape: tuple[int, ...], path: str) -> tuple[int, ...]:
    """torch's shape of a packed entry (F4: two fp4 values per float4_e2m1fn_x2 element)."""
    found = dtypes.torch_shape(dt, shape)
    if found is None:
        raise InputError(f"bad safetensors header: tensor {key!r} is {code}{list(shape)}, which torch cannot hold "
                         f"as {dt.name} (the last dimension must count whole bytes of "
                         f"{dt.safetensors_per_item} values)", path)
    return found


READER = FormatReader(Format.SAFETENSORS, read_safetensors, weights_only_container=wo_input.SAFETENSORS)
