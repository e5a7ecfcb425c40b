"""Sharded safetensors sets: ``model-XXXXX-of-YYYYY.safetensors`` plus ``model.safetensors.index.json``.

The layout Hugging Face ``save_pretrained`` writes and its loaders read:
tensors are packed in order into shards of at most ``max_shard_size`` bytes
(a tensor larger than that gets a shard of its own), and the index maps
every key, aliases of tied tensors included, to the shard that holds it.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ...errors import UsageError
from ..base import OutTensor
from ..output import write_all
from .single import check_dtypes, write_safetensors

INDEX_NAME = "model.safetensors.index.json"
SHARD_SUFFIXES = (".safetensors", ".index.json")

_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}


def parse_size(text: str) -> int:
    """``5GB`` (10^9, as Hugging Face counts), ``500MiB`` (2^20) or a byte count."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _UNITS:
        raise UsageError(f"--max-shard-size {text!r}: expected a size like 5GB, 500MB or 2GiB")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise UsageError(f"--max-shard-size {text!r}: must be more than 0 bytes")
    return value


def split(tensors: Sequence[OutTensor], max_bytes: int) -> list[list[OutTensor]]:
    shards: list[list[OutTensor]] = []
    current: list[OutTensor] = []
    size = 0
    for t in tensors:
        if current and size + t.nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def shard_names(count: int, stem: str = "model") -> list[str]:
    return [f"{stem}-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


class Shard(NamedTuple):
    """One file of a sharded set: its name, its tensors, and the ``__metadata__`` it carries."""

    name: str
    tensors: list[OutTensor]
    metadata: dict[str, str]
    aliases: dict[str, str]  # alias -> stored key, for the tensors of this file


def plan_shards(stored: Sequence[OutTensor], aliases: Mapping[str, str], metadata: Mapping[str, str],
                max_bytes: int, stem: str = "model") -> list[Shard]:
    """The files of the set, in order: tensors packed up to ``max_bytes``, each alias beside its tensor."""
    groups = split(stored, max_bytes)
    shards = []
    for name, tensors in zip(shard_names(len(groups), stem), groups, strict=True):
        keys = {t.key for t in tensors}
        own = {a: k for a, k in aliases.items() if k in keys}
        meta = dict(metadata)
        meta.update(own)
        shards.append(Shard(name, tensors, meta, own))
    return shards


def write_shard(fd: int, shard: Shard, on_bytes: Callable[[int], None] | None = None) -> int:
    return write_safetensors(fd, shard.tensors, shard.metadata, on_bytes)


def index_bytes(shards: Sequence[Shard]) -> bytes:
    """``model.safetensors.index.json``: every key, aliases included, to the file that holds it."""
    weight_map: dict[str, str] = {}
    total = 0
    for shard in shards:
        weight_map.update({t.key: shard.name for t in shard.tensors})
        weight_map.update({a: shard.name for a in shard.aliases})
        total += sum(t.nbytes for t in shard.tensors)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return (json.dumps(index, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_sharded(folder: str, create: Callable[[str], int], stored: Sequence[OutTensor],
                  aliases: Mapping[str, str], metadata: Mapping[str, str], max_bytes: int,
                  on_bytes: Callable[[int], None] | None = None, stem: str = "model") -> list[str]:
    """Write the shards and the index into ``folder`` (a temporary folder); returns the shard names.

    ``stem`` names the files as the library's loader expects (``model``, ``diffusion_pytorch_model``).
    """
    check_dtypes(stored)
    shards = plan_shards(stored, aliases, metadata, max_bytes, stem)
    for shard in shards:
        fd = create(shard.name)
        try:
            write_shard(fd, shard, on_bytes)
        finally:
            os.close(fd)
    fd = create(INDEX_NAME if stem == "model" else f"{stem}.safetensors.index.json")
    try:
        write_all(fd, index_bytes(shards))
    finally:
        os.close(fd)
    return [shard.name for shard in shards]
