"""Sharded sets: a ``*.index.json`` weight map over safetensors or .bin shards."""
from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io import paths
from ...limits import DEFAULT_LIMITS
from ...model import DataSource, GlobalRef, TensorMeta
from ...pickles.torch_rules import inputs as wo_input
from ..checkpoint import located_tensors
from ..detect import find_index
from ..interface import FormatReader, Loaded, ReadOptions, part_reader
from ..safetensors import restore_aliases


def index_path(path: str) -> str:
    if paths.isdir(path):
        found = find_index(path)
        if found is None:
            raise InputError("folder holds no *.index.json", path)
        return found
    return path


def read_index(path: str, max_bytes: int = DEFAULT_LIMITS.max_header_bytes) -> dict[str, Any]:
    with paths.open_bytes(path) as data:  # a FIFO named *.index.json would block open()+read() forever
        size = data.size
        if size > max_bytes:
            raise LimitExceeded(f"shard index is {size} bytes, over the limit of {max_bytes} "
                                "(raise it with --max-header-bytes)", path)
        raw = data.read(0, size)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"bad shard index: {exc}", path) from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise InputError("bad shard index: no \"weight_map\" object", path)
    wm = index["weight_map"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise InputError("bad shard index: weight_map must map tensor names to file names", path)
    folder = paths.dirname(path)
    for shard in sorted(set(wm.values())):
        why = paths.outside_folder(folder, shard)
        if why:
            raise InputError(f"bad shard index: shard name {shard!r} {why}", path)
    return index


def read_sharded(
    path: str, options: ReadOptions, read_file: Callable[[str, ReadOptions], Loaded],
    locate: Callable[[Loaded, str], list[TensorMeta]],
) -> Loaded:
    ipath = index_path(path)
    index = read_index(ipath, options.limits.max_header_bytes)
    folder = paths.dirname(ipath)
    weight_map: dict[str, str] = index["weight_map"]
    shards = list(OrderedDict.fromkeys(weight_map.values()))
    missing = paths.missing_files(folder, shards)
    if missing:
        raise InputError(f"shard {missing[0]!r} named by the index is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""), ipath)
    merged: OrderedDict[str, TensorMeta] = OrderedDict()
    references: list[GlobalRef] = []
    warnings: list[str] = []
    sources: list[DataSource] = []
    per_shard: dict[str, dict[str, TensorMeta]] = {}
    shard_formats = set()
    for shard, spath, part in _read_shards(folder, shards, options, read_file):
        shard_formats.add(part.format)
        references.extend(part.references)
        warnings.extend(f"{shard}: {w}" for w in part.warnings)
        sources.extend(part.sources)
        per_shard[shard] = {t.key: t for t in locate(part, spath)}
    for key, shard in weight_map.items():
        tensor = per_shard[shard].get(key)
        if tensor is None:
            raise InputError(f"tensor {key!r} is mapped to shard {shard!r} but that shard does not hold it", ipath)
        merged[key] = tensor
    meta = index.get("metadata")
    if isinstance(meta, dict):  # huggingface_hub.save_torch_state_dict's tie records: {alias: stored key}
        restore_aliases(merged, {k: v for k, v in meta.items() if isinstance(v, str) and k not in weight_map})
    unlisted = sorted(k for shard, ts in per_shard.items() for k in ts if weight_map.get(k) != shard)
    if unlisted:
        warnings.append(
            f"{len(unlisted)} tensors in shards are not in the index weight_map (ignored): {', '.join(unlisted[:5])}"
        )
    metadata = {k: v for k, v in index.items() if k != "weight_map"}
    metadata["shards"] = shards
    metadata["shard_format"] = "/".join(sorted(shard_formats))
    return Loaded(Format.SHARDED, merged, tuple(references), tuple(warnings), tuple(sources), layout="state_dict",
                  metadata=metadata)


def read_sharded_set(path: str, options: ReadOptions) -> Loaded:
    """A sharded set, each shard read by its own reader; weights_only is judged shard by shard."""
    read_file = part_reader(options)
    parts: list[tuple[str, Loaded]] = []

    def read_part(p: str, o: ReadOptions) -> Loaded:
        part = read_file(p, o)
        parts.append((os.path.basename(p), part))
        return part

    loaded = read_sharded(path, options, read_part, located_tensors)
    return dataclasses.replace(loaded, weights_only=wo_input.WeightsOnlyInput(wo_input.SHARDED, path=path, parts=tuple(
        (name, part.weights_only) for name, part in parts)))


def _read_shards(folder: str, shards: list[str], options: ReadOptions,
                 read_file: Callable[[str, ReadOptions], Loaded]) -> Iterator[tuple[str, str, Loaded]]:
    """(shard, path, what it holds), in index order; a remote set's shards are read concurrently."""
    spaths = [paths.join(folder, s) for s in shards]
    if not paths.is_url(folder) or len(shards) < 2:
        for shard, spath in zip(shards, spaths, strict=True):
            yield shard, spath, read_file(spath, options)
        return
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(8, len(shards)), thread_name_prefix="ckpt-shard") as pool:
        futures = [pool.submit(contextvars.copy_context().run, read_file, p, options) for p in spaths]
        try:
            for shard, spath, future in zip(shards, spaths, futures, strict=True):
                yield shard, spath, future.result()
        finally:
            for future in futures:
                future.cancel()


READER = FormatReader(Format.SHARDED, read_sharded_set, composite=True)
