"""A Hugging Face folder that ``from_pretrained`` loads: the weights as safetensors, and the files beside them.

The weights are written as the library's loader names them (one file, or
shards and an index with ``--max-shard-size``), with ``{"format": "pt"}`` in
their metadata as ``save_pretrained`` writes it. The source folder's config,
tokenizer and other small files (formats/hf/deploy.py chose them) are copied
byte for byte, except ``config.json``'s dtype field, rewritten when every
cast tensor went to one dtype, so that ``dtype="auto"`` loads what was
written.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..formats.hf.deploy import HfOutput
from ..io import paths
from .output import write_all
from .payload import SafetensorsPayload

_CHUNK = 8 << 20
_DTYPE_FIELDS = ("torch_dtype", "dtype")  # transformers 4 writes the first, 5 the second


class HfWritten(NamedTuple):
    shards: tuple[str, ...]
    copied: tuple[str, ...]  # relative names, "/"-separated
    retyped: str | None  # the config file whose dtype was rewritten


def retyped_config(raw: bytes, dtype: str) -> bytes | None:
    """``config.json`` with its dtype field(s) set to ``dtype``; None when it has none or they already say it."""
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # not JSON: copied as it is (its loader will say what is wrong with it)
    if not isinstance(config, dict):
        return None
    fields = [f for f in _DTYPE_FIELDS if isinstance(config.get(f), str)]
    if not fields or all(config[f] == dtype for f in fields):
        return None
    for f in fields:
        config[f] = dtype
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8")  # as transformers writes it


def _copy(source: str, fd: int) -> None:
    with paths.open_bytes(source) as data:
        for offset in range(0, data.size, _CHUNK):
            write_all(fd, data.read(offset, min(_CHUNK, data.size - offset)))


def write_hf_folder(folder: str, create: Callable[[str], int], payload: SafetensorsPayload, hf: HfOutput,
                    shard_bytes: int | None, cast_to: str | None,
                    on_bytes: Callable[[int], None] | None = None) -> HfWritten:
    """Write the weights and copy the side files into ``folder`` (a temporary folder)."""
    from .safetensors.sharded import write_sharded
    from .safetensors.single import write_safetensors

    def create_in(name: str) -> int:
        parent = os.path.dirname(os.path.join(folder, name))
        os.makedirs(parent, exist_ok=True)
        return create(name)

    prefix = f"{hf.weights_dir}/" if hf.weights_dir else ""
    meta = {**payload.meta, "format": "pt"}
    shards: Sequence[str] = ()
    if shard_bytes is not None:
        shards = write_sharded(folder, lambda n: create_in(prefix + n), payload.stored, payload.aliases, meta,
                               shard_bytes, on_bytes, stem=hf.stem)
    else:
        fd = create_in(prefix + hf.weights_name)
        try:
            write_safetensors(fd, payload.stored, {**meta, **payload.aliases}, on_bytes)
        finally:
            os.close(fd)
    retyped = None
    if hf.copy_from is not None:
        for rel in hf.files:
            source = paths.join(hf.copy_from, rel)
            new = None
            if cast_to is not None and rel in ("config.json", f"{prefix}config.json"):
                with paths.open_bytes(source) as data:
                    new = retyped_config(data.read(0, data.size), cast_to)
            fd = create_in(rel)
            try:
                if new is None:
                    _copy(source, fd)
                else:
                    write_all(fd, new)
                    retyped = rel
            finally:
                os.close(fd)
    return HfWritten(tuple(shards), hf.files, retyped)
