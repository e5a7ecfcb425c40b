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
from typing import TYPE_CHECKING, NamedTuple

from ..format_names import OutputFormat
from .interface import PayloadMismatch, Reread, Shaped, ShapeRequest, WriteRequest, Written, folder_of
from .payload import SafetensorsPayload

if TYPE_CHECKING:
    from ..formats.hf import HfOutput
    from ..io.atomic import AtomicDir, AtomicFile
    from .safetensors import SafetensorsWriter, ShardedWriter

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
    from ..io import paths
    from .output import write_all

    with paths.open_bytes(source) as data:
        for offset in range(0, data.size, _CHUNK):
            write_all(fd, data.read(offset, min(_CHUNK, data.size - offset)))


def write_hf_folder(folder: str, create: Callable[[str], int], payload: SafetensorsPayload, hf: HfOutput,
                    shard_bytes: int | None, cast_to: str | None,
                    on_bytes: Callable[[int], None] | None = None) -> HfWritten:
    """Write the weights and copy the side files into ``folder`` (a temporary folder)."""
    from ..io import paths
    from .output import write_all
    from .safetensors import write_safetensors, write_sharded

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


class HfFolderWriter:
    """A folder ``from_pretrained`` loads: the weights as safetensors (sharded by ``--max-shard-size``) beside the
    source folder's config, tokenizer and other small files (formats/hf/deploy.py chose them)."""

    format = OutputFormat.HF_FOLDER
    names = ("hf", "hf-folder")
    extensions: tuple[str, ...] = ()
    folder = True
    shared = False
    suffixes = (".safetensors", ".index.json")  # safetensors/sharded.SHARD_SUFFIXES; the copied files are named
    reread: Reread = "mapping"  # the weights, re-read as the safetensors file or set they are; the folder after

    def shape(self, request: ShapeRequest) -> Shaped:
        """The weights as a safetensors file or set; say what from_pretrained will lack."""
        from dataclasses import replace

        from .safetensors import shape_flat

        shaped = shape_flat(request, self.format)
        hf = request.hf
        more: list[str] = []
        configs = ("config.json", "adapter_config.json", f"{hf.weights_dir}/config.json") if hf is not None else ()
        if hf is not None and not any(c in hf.files for c in configs):
            more.append("the output folder gets no config.json, which from_pretrained needs"
                        + (f" ({hf.copy_from} holds none)" if hf.copy_from else "")
                        + ": --config-from DIR copies a model's config and tokenizer files"
                        + (f" (e.g. --config-from {hf.hint})" if hf.hint else ""))
        if hf is not None:
            pickled = [f for f in hf.files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
            if pickled:
                more.append(f"copied as they are, not migrated: {', '.join(pickled[:5])} (another module's pickled "
                            "weights: `ckpt scan` them before loading)")
        return replace(shaped, warnings=shaped.warnings + tuple(more))

    def sizes(self, request: WriteRequest) -> list[int]:
        return _weights_writer(request).sizes(request)

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        return _weights_writer(request).bound(request)

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        from .safetensors import payload_of

        tmp, payload, p, hf = folder_of(into), payload_of(request, self.format), request.progress, request.hf
        if hf is None:
            raise PayloadMismatch("a Hugging Face folder output was planned without its folder plan")
        cast_to = request.cast_to
        p.start("writing", sum(t.nbytes for t in payload.stored))
        written = write_hf_folder(tmp.path, tmp.create, payload, hf, request.shard_bytes, cast_to, p.advance)
        notes = (f"{written.retyped}: its dtype field rewritten to {cast_to}, the dtype the weights were cast to "
                 "(the other copied files are byte for byte the source's)",) if written.retyped else ()
        return Written(written.shards, notes)


def _weights_writer(request: WriteRequest) -> SafetensorsWriter | ShardedWriter:
    from .safetensors import SafetensorsWriter, ShardedWriter

    return ShardedWriter() if request.shard_bytes else SafetensorsWriter()
