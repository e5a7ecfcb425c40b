"""torch's distributed Hugging Face safetensors, read as the model they hold.

``torch.distributed.checkpoint.HuggingFaceStorageWriter(save_distributed=True)``
has every rank write ``shard-RRRRR-model-NNNNN-of-MMMMM.safetensors``: plain
safetensors files whose tensors are that rank's slices, placed by the JSON in
``__metadata__["DCP_SHARDING_INFO"]`` (``{key: {"saved_offsets": [...]}}``).
No file records a tensor's global shape: like torch's own
``consolidate_safetensors_files``, each dimension is the furthest any slice
reaches. Unlike it, the slices must tile that shape exactly (no gap, no
overlap), or the folder is refused: a gap would be zeros, an overlap a
silent choice between ranks. Only the headers are read; each slice is a byte
range of its file, streamed (row blocks) or placed (other splits) by the DCP
stream source.
"""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from math import prod

from ... import dtypes
from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io import paths
from ...model import StorageRef, TensorMeta, contiguous_strides
from ...pickles.torch_rules import inputs as wo_input
from ..dcp import Chunk, DcpStreamSource
from ..interface import FormatReader, Loaded, ReadOptions
from .header import checked_entries, read_header

SHARDING_KEY = "DCP_SHARDING_INFO"
_NAME = re.compile(r"shard-(\d{5})-model-(\d{5})-of-(\d{5})\.safetensors$")
_GRID_CELLS = 1 << 20  # above this many cells, tiling is checked pair by pair


@dataclass(frozen=True)
class Slice:
    """One rank's slice of a tensor: where it sits in the global tensor and in which file."""

    file: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: dtypes.DType
    start: int  # absolute offset of its bytes in the file
    nbytes: int


def read_distributed(path: str, options: ReadOptions) -> Loaded:
    """A folder of distributed safetensors shards: the consolidated keys, shapes and dtypes, from headers only."""
    names = sorted(n for n in paths.listdir(path) if n.endswith(".safetensors"))
    if not names:
        raise InputError("folder holds no *.safetensors file", path)
    _check_ranks(names, path)
    slices: dict[str, list[Slice]] = {}
    version = None
    for name in names:
        for key, piece, v in _file_slices(path, name, options):
            slices.setdefault(key, []).append(piece)
            version = version or v
    if len(slices) > options.limits.max_tensors:
        raise LimitExceeded(f"the rank files hold {len(slices)} tensors, over the limit of "
                            f"{options.limits.max_tensors} (raise it with --max-tensors)", path)
    source = DcpStreamSource(path, options.limits)
    tensors = []
    for key in sorted(slices):
        dt, shape = _global(key, slices[key], path)
        source.add(key, dt, shape, [Chunk(s.offsets, s.sizes, s.file, s.start, s.nbytes, raw=True)
                                    for s in slices[key]])
        tensors.append(TensorMeta(key, dt.name, shape, contiguous_strides(shape), 0,
                                  StorageRef(source, key, prod(shape) * dt.itemsize), "cpu"))
    root: OrderedDict[str, TensorMeta] = OrderedDict((t.key, t) for t in tensors)
    ranks = len({_rank(n) for n in names})
    info = {"files": len(names), "ranks": ranks, "dcp_version": version, "slices": sum(len(v) for v in slices.values())}
    warning = (f"{ranks} rank file(s) found; the writer records no rank count, so a missing last rank's file would "
               f"shrink the global shapes unseen: check that the run had {ranks} rank(s)")
    return Loaded(Format.DIST_SAFETENSORS, root, warnings=(warning,), sources=(source,), layout="state_dict",
                  metadata={"distributed_safetensors": info}, tensors=tuple(tensors))


def _rank(name: str) -> str:
    m = _NAME.search(name)
    return m.group(1) if m else name


def _check_ranks(names: list[str], folder: str) -> None:
    """Rank files are numbered 1..N by the writer: a gap is a missing rank (the last one cannot be told)."""
    ranks = sorted({int(m.group(1)) for m in map(_NAME.search, names) if m})
    missing = sorted(set(range(1, ranks[-1] + 1)) - set(ranks)) if ranks else []
    if missing:
        raise InputError(f"the files of rank(s) {', '.join(f'{r:05d}' for r in missing[:5])} are missing "
                         f"(shard-{missing[0]:05d}-model-*.safetensors): the save is incomplete", folder)


def _file_slices(folder: str, name: str, options: ReadOptions) -> list[tuple[str, Slice, str | None]]:
    """Each tensor of one rank file with its placement, checked against the file's own header."""
    file = paths.join(folder, name)
    header, start, data_len, duplicates = read_header(file, options)
    meta = header.pop("__metadata__", None)
    if duplicates:
        raise InputError(f"duplicate tensor keys in the header of {name}: {', '.join(map(repr, duplicates[:5]))}",
                         folder)
    raw = meta.get(SHARDING_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, str):
        raise InputError(f"{name} has no {SHARDING_KEY} in its __metadata__, so it is not a slice of this "
                         "distributed save (the other files are); move it out of the folder", folder)
    try:
        info = json.loads(raw)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise InputError(f"{name}: {SHARDING_KEY} is not a JSON object", folder)
    entries = checked_entries(header, data_len, options, file)
    out = []
    for begin, end, key, dt, shape in entries:
        place = info.get(key)
        offsets = place.get("saved_offsets") if isinstance(place, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == len(shape)
                and all(type(o) is int and o >= 0 for o in offsets)):
            raise InputError(f"{name}: {SHARDING_KEY} gives tensor {key!r} {list(shape)} no valid "
                             f"saved_offsets (one non-negative int per dimension): {place!r}", folder)
        out.append((key, Slice(name, tuple(offsets), shape, dt, start + begin, end - begin),
                    meta.get("DCP_VERSION") if isinstance(meta, dict) else None))
    extra = sorted(set(info) - set(header))
    if extra:
        raise InputError(f"{name}: {SHARDING_KEY} places {', '.join(map(repr, extra[:5]))}, which the file does "
                         "not hold", folder)
    return out


def _global(key: str, slices: list[Slice], folder: str) -> tuple[dtypes.DType, tuple[int, ...]]:
    """The tensor's dtype and global shape (each dimension as far as a slice reaches), its slices tiling it."""
    first = slices[0]
    for s in slices[1:]:
        if s.dtype != first.dtype or len(s.sizes) != len(first.sizes):
            raise InputError(f"the slices of tensor {key!r} disagree: {first.dtype.name}{list(first.sizes)} in "
                             f"{first.file}, {s.dtype.name}{list(s.sizes)} in {s.file}", folder)
    shape = tuple(max(s.offsets[d] + s.sizes[d] for s in slices) for d in range(len(first.sizes)))
    live = [s for s in slices if prod(s.sizes)]
    why = _tiling_gap(shape, live)
    if why:
        where = ", ".join(f"{s.file} at {list(s.offsets)} {list(s.sizes)}" for s in slices[:4])
        raise InputError(f"the slices of tensor {key!r} do not tile its shape {list(shape)} ({why}): {where}"
                         f"{' ...' if len(slices) > 4 else ''}", folder)
    return first.dtype, shape


def _tiling_gap(shape: tuple[int, ...], live: list[Slice]) -> str | None:
    """Why the non-empty slices do not cover ``shape`` exactly once (None: they do)."""
    total = prod(shape)
    covered = sum(prod(s.sizes) for s in live)
    if not shape:
        return None if len(live) == 1 else f"{len(live)} slices of a scalar"
    if covered < total:
        return f"{total - covered} of its {total} elements are in no slice"
    # Cut each dimension at every slice edge; every cell of the grid must lie in exactly one slice.
    cuts = [sorted({0, n} | {s.offsets[d] for s in live} | {s.offsets[d] + s.sizes[d] for s in live})
            for d, n in enumerate(shape)]
    if prod(len(c) - 1 for c in cuts) <= _GRID_CELLS:
        seen: set[tuple[int, ...]] = set()
        for s in live:
            ranges = [range(c.index(s.offsets[d]), c.index(s.offsets[d] + s.sizes[d])) for d, c in enumerate(cuts)]
            for cell in _product(ranges):
                if cell in seen:
                    return "two slices overlap"
                seen.add(cell)
        return None if len(seen) == prod(len(c) - 1 for c in cuts) else "a part is in no slice"
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            if all(a.offsets[d] < b.offsets[d] + b.sizes[d] and b.offsets[d] < a.offsets[d] + a.sizes[d]
                   for d in range(len(shape))):
                return "two slices overlap"
    return None if covered == total else f"{covered - total} elements more than its {total}"


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [(*c, i) for c in out for i in r]
    return out


READER = FormatReader(Format.DIST_SAFETENSORS, read_distributed, weights_only_container=wo_input.OTHER,
                      weights_only_note=(
    "a folder of distributed safetensors rank files: torch.distributed.checkpoint's "
    "HuggingFaceStorageReader reads it (each file holds no pickle), not torch.load"))
