"""How many bytes each file of a planned output will take, known before a byte is written.

migrate checks the output file system's free space against these figures
before it reads a tensor byte. They come from the plan alone (tensor sizes,
keys, shapes, the pickled container):

- torch zip: exact (the archive's layout is replayed, padding and ZIP64
  records included);
- safetensors and sharded sets: the tensor bytes exactly; each header and
  the index at most a few bytes per tensor over (an offset is counted with
  as many digits as the largest one);
- DCP: the tensor bytes plus an allowance for torch's records (about
  1.6 KB per tensor in the data file and 200 bytes per tensor plus the key
  in ``.metadata``, as measured with torch 2.13; 2 KiB and 512 bytes are
  counted), since torch's writer cannot be asked in advance.

``quick_bound`` is a looser upper bound that costs next to nothing; the
free-space check asks for the exact figures only when the disk is too full
for the bound (on 200,000 tensors they take 0.1-0.2 s).
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from .. import dtypes
from ..format_names import OutputFormat
from .base import OutTensor
from .payload import Payload, TorchPayload

if TYPE_CHECKING:
    from .torchsave.datapkl import StorageTable

DCP_DATA_PER_TENSOR = 2048
DCP_METADATA_PER_TENSOR = 512
DCP_FIXED = 16384

_PLAIN_KEY = re.compile(r'[ -!#-\[\]-~]*')  # as the safetensors writer: JSON as is


def _plain(text: str) -> bool:
    """``_PLAIN_KEY.fullmatch(text)``, as four C-speed scans (a regex over 6 MB of keys takes 60 ms)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _key_json_len(key: str) -> int:
    if _plain(key):
        return len(key) + 2
    return len(json.dumps(key, ensure_ascii=False).encode("utf-8"))


def safetensors_size(tensors: Sequence[OutTensor], metadata: Mapping[str, str]) -> int:
    """At least the size of the safetensors file ``write_safetensors`` writes for these tensors."""
    data: int = sum(map(attrgetter("nbytes"), tensors))
    digits = len(str(data))
    header = 2  # the braces
    parts = 0
    if metadata:
        header += len('"__metadata__":') + len(json.dumps(dict(metadata), separators=(",", ":"),
                                                           ensure_ascii=False).encode("utf-8"))
        parts += 1
    # totals by kind rather than per tensor: 200,000 tensors take milliseconds, not a second
    keys = list(map(attrgetter("key"), tensors))
    if _plain("".join(keys)):
        header += sum(map(len, keys)) + 2 * len(keys)
    else:
        header += sum(map(_key_json_len, keys))
    codes = {name: len(d.safetensors or "") for name, d in dtypes.BY_NAME.items()}
    header += sum(codes.get(dtype, 8) * n for dtype, n in Counter(map(attrgetter("dtype"), tensors)).items())
    header += sum(len(",".join(map(str, shape))) * n for shape, n in Counter(map(attrgetter("shape"), tensors)).items())
    # F4's header doubles the last dimension: at most one more digit per packed tensor
    header += sum(1 for t in tensors if getattr(dtypes.BY_NAME.get(t.dtype), "safetensors_per_item", 1) != 1)
    header += len(keys) * (len(':{"dtype":"","shape":[],"data_offsets":[,]}') + 2 * digits)
    parts += len(keys)
    header += max(parts - 1, 0)  # commas
    header += -header % 8  # padded with spaces to a multiple of 8
    return 8 + header + data


def index_size(stored: Sequence[OutTensor], aliases: Mapping[str, str], shard_name_len: int) -> int:
    """At least the size of ``model.safetensors.index.json`` (``json.dumps(indent=2)`` plus a newline)."""
    total = sum(t.nbytes for t in stored)
    size = len('{\n  "metadata": {\n    "total_size": \n  },\n  "weight_map": {\n  }\n}\n') + len(str(total))
    per_entry = len('    : "",\n') + shard_name_len
    keys = [t.key for t in stored] + list(aliases)
    return size + sum(_key_json_len(k) + per_entry for k in keys)


def _zip_size(members: Sequence[tuple[int, int]]) -> int:
    """The exact size of the archive ``torchzip.ZipWriter`` writes for (length of the full member name in
    bytes, size) pairs."""
    from .torchsave import archive as torchzip

    limit = torchzip.ZIP64_LIMIT  # read at call time: tests lower it
    align = torchzip.ALIGNMENT
    count = len(members)
    names = sum(n for n, _ in members)
    if sum(size for _, size in members) + count * (34 + align) + names < limit:
        pos = 0  # no ZIP64 record anywhere (the usual case): only the alignment padding varies
        for name_len, size in members:
            start = pos + 34 + name_len
            pos = start - start % -align + size
        directory = 46 * count + names
    else:
        pos = directory = 0
        for name_len, size in members:
            zip64 = size >= limit
            start = pos + 34 + name_len + (20 if zip64 else 0)
            fields = (2 if zip64 else 0) + (1 if pos >= limit else 0)
            pos = start + -start % align + size
            directory += 46 + name_len + (4 + 8 * fields if fields else 0)
    end = 22
    if count >= min(0xFFFF, limit) or directory >= limit or pos >= limit:
        end += 56 + 20
    return pos + directory + end


def torch_zip_size(out: str, data_pkl: bytes, table: StorageTable) -> int:
    from .torchsave.archive import ALIGNMENT, archive_name

    base = len(archive_name(out).encode("utf-8")) + 1
    named = [("data.pkl", len(data_pkl)), (".format_version", 1), (".storage_alignment", len(str(ALIGNMENT))),
             ("byteorder", len(sys.byteorder))]
    members = [(base + len(name), size) for name, size in named]
    data = base + len("data/")  # storage keys are ASCII digits
    members += [(data + len(st.key), st.nbytes) for st in table.storages]
    members += [(base + len("version"), 2), (base + len(".data/serialization_id"), 40)]
    return _zip_size(members)


def sharded_sizes(stored: Sequence[OutTensor], aliases: Mapping[str, str], metadata: Mapping[str, str],
                  max_bytes: int) -> list[int]:
    from .safetensors.sharded import shard_names, split

    shards = split(stored, max_bytes)
    names = shard_names(len(shards))
    sizes = []
    for tensors in shards:
        keys = {t.key for t in tensors}
        meta = dict(metadata)
        meta.update({a: k for a, k in aliases.items() if k in keys})
        sizes.append(safetensors_size(tensors, meta))
    sizes.append(index_size(stored, aliases, len(names[0]) if names else 0))
    return sizes


def dcp_sizes(tensors: Sequence[OutTensor]) -> list[int]:
    data = sum(t.nbytes + DCP_DATA_PER_TENSOR for t in tensors)
    meta = DCP_FIXED + sum(DCP_METADATA_PER_TENSOR + 2 * len(t.key.encode("utf-8")) for t in tensors)
    return [data, meta]


def quick_bound(fmt: OutputFormat, out: str, tensors: Sequence[OutTensor], payload: Payload,
                shard_bytes: int | None) -> tuple[int, int]:
    """(at least the total bytes, at least the number of files) of the output, from sums alone."""
    from .torchsave.archive import archive_name

    if isinstance(payload, TorchPayload):
        storages = payload.table.storages
        # local header + central record: the name twice, ZIP64 extras, at most 63 bytes of padding
        per_member = 2 * (len(archive_name(out).encode("utf-8")) + 32) + 191
        return (sum(map(attrgetter("nbytes"), storages)) + len(payload.data_pkl) + (len(storages) + 6) * per_member
                + 98, 1)
    if payload is None:  # DCP
        return sum(dcp_sizes(tensors)), 2
    stored, aliases = payload.stored, payload.aliases
    count = len(stored)
    data = sum(map(attrgetter("nbytes"), stored))
    keys = sum(map(len, map(attrgetter("key"), stored)))  # a character is at most 6 bytes of JSON
    dims = sum(map(len, map(attrgetter("shape"), stored)))
    headers = 6 * keys + 100 * count + 21 * dims
    meta = 16 + len(json.dumps({**payload.meta, **aliases}, ensure_ascii=False).encode("utf-8"))
    if fmt is OutputFormat.SHARDED:
        shards = min(count, 2 * -(-data // (shard_bytes or 1)) + 1)  # two neighbouring shards exceed the limit
        index = 6 * (keys + sum(map(len, aliases))) + 64 * (count + len(aliases)) + 256
        return data + headers + shards * meta + index, shards + 1
    return data + headers + meta, 1


def planned_sizes(fmt: OutputFormat, out: str, tensors: Sequence[OutTensor], payload: Payload,
                  shard_bytes: int | None) -> list[int]:
    """The size of each file the output will hold (one for a file output)."""
    if isinstance(payload, TorchPayload):
        return [torch_zip_size(out, payload.data_pkl, payload.table)]
    if payload is None:  # DCP
        return dcp_sizes(tensors)
    if fmt is OutputFormat.SHARDED:
        return sharded_sizes(payload.stored, payload.aliases, payload.meta, shard_bytes or 1)
    return [safetensors_size(payload.stored, {**payload.meta, **payload.aliases})]
