"""How large a safetensors file, a sharded set and its index will be, from the plan alone (sizes.py says why).

The tensor bytes exactly; each header and the index at most a few bytes per
tensor over (an offset is counted with as many digits as the largest one).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter

from ... import dtypes
from ..base import OutTensor
from ..payload import SafetensorsPayload

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


def sharded_sizes(stored: Sequence[OutTensor], aliases: Mapping[str, str], metadata: Mapping[str, str],
                  max_bytes: int) -> list[int]:
    from .sharded import shard_names, split

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



def bound(payload: SafetensorsPayload, shard_bytes: int | None) -> tuple[int, int]:
    """(at least the total bytes, at least the number of files) of a safetensors file, or of a sharded set when
    ``shard_bytes`` is given, from sums alone."""
    stored, aliases = payload.stored, payload.aliases
    count = len(stored)
    data = sum(map(attrgetter("nbytes"), stored))
    keys = sum(map(len, map(attrgetter("key"), stored)))  # a character is at most 6 bytes of JSON
    dims = sum(map(len, map(attrgetter("shape"), stored)))
    headers = 6 * keys + 100 * count + 21 * dims
    meta = 16 + len(json.dumps({**payload.meta, **aliases}, ensure_ascii=False).encode("utf-8"))
    if shard_bytes is not None:
        shards = min(count, 2 * -(-data // shard_bytes) + 1)  # two neighbouring shards exceed the limit
        index = 6 * (keys + sum(map(len, aliases))) + 64 * (count + len(aliases)) + 256
        return data + headers + shards * meta + index, shards + 1
    return data + headers + meta, 1
