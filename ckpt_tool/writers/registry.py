"""Every output format's writer, one line each: what ``--to``, OUT's name and ``--max-shard-size`` choose.

A new output format is a module with one ``Writer`` (interface.py) and a
line in ``WRITERS``; migrate, the free-space check and the verification
find it here. The writer modules import their heavy parts only when they
write, so loading this table costs next to nothing.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import UsageError
from ..format_names import OutputFormat
from .dcp import DcpWriter
from .hf_folder import HfFolderWriter
from .interface import Writer
from .safetensors import SafetensorsWriter, ShardedWriter
from .torchsave import TorchZipWriter

WRITERS: tuple[Writer, ...] = (
    TorchZipWriter(),
    SafetensorsWriter(),
    ShardedWriter(),
    DcpWriter(),
    HfFolderWriter(),
)

BY_FORMAT: Mapping[OutputFormat, Writer] = {w.format: w for w in WRITERS}
TO_CHOICES: Mapping[str, OutputFormat] = {name: w.format for w in WRITERS for name in w.names}  # --to values
TO_VALUES = tuple(w.names[0] for w in WRITERS if w.names)  # what messages and the CLI offer
_BY_EXTENSION: Mapping[str, OutputFormat] = {ext: w.format for w in WRITERS for ext in w.extensions}
FOLDER_FORMATS = frozenset(w.format for w in WRITERS if w.folder)
SHARED_FORMATS = frozenset(w.format for w in WRITERS if w.shared)  # several processes may write them


def writer(fmt: OutputFormat) -> Writer:
    """The writer of ``fmt``."""
    return BY_FORMAT[fmt]


def choose_format(out: str | None, to: str | None, max_shard_size: int | None) -> OutputFormat:
    """The output format: ``--to`` wins, else OUT's extension; ``--max-shard-size`` means a sharded folder."""
    fmt: OutputFormat | None
    if to is not None:
        fmt = TO_CHOICES.get(to.lower())
        if fmt is None:
            raise UsageError(f"--to {to!r}: expected one of {', '.join(TO_VALUES)}")
        named = _BY_EXTENSION.get(os.path.splitext((out or "").rstrip("/"))[1].lower())
        if named is not None and named != fmt:
            raise UsageError(f"--to {to} writes {fmt} but the name {out!r} says {named}: loaders go by the "
                             "extension, so give OUT a matching name")
    elif out is None:
        fmt = OutputFormat.SAFETENSORS if max_shard_size else OutputFormat.TORCH_ZIP
    else:
        fmt = _from_name(out, max_shard_size)
    if fmt is OutputFormat.HF_FOLDER:
        return fmt  # sharded or not, by --max-shard-size
    if max_shard_size:
        if fmt is not OutputFormat.SAFETENSORS and fmt is not OutputFormat.SHARDED:
            raise UsageError("--max-shard-size writes sharded safetensors; it cannot be combined with "
                             f"{'--to ' + to if to else 'a ' + fmt + ' output'}")
        if out is not None and out.lower().endswith(".safetensors"):
            raise UsageError(f"--max-shard-size writes a folder of shards: give OUT as a folder name, "
                             f"e.g. {os.path.splitext(out)[0]}/")
        return OutputFormat.SHARDED
    return fmt


def _from_name(out: str, max_shard_size: int | None) -> OutputFormat:
    """The format OUT's name says (a folder: sharded with --max-shard-size, DCP when it already is one)."""
    ext = os.path.splitext(out.rstrip("/"))[1].lower()
    fmt = _BY_EXTENSION.get(ext)
    if fmt is not None:
        return fmt
    if max_shard_size and (ext == "" or out.endswith("/")):
        return OutputFormat.SHARDED
    if ext == "" and os.path.isfile(os.path.join(out, ".metadata")):
        return OutputFormat.DCP
    raise UsageError(f"cannot tell the output format from {out!r}: use a .pth, .pt, .bin or "
                     f".safetensors name, or pass --to {'|'.join(TO_VALUES)}")

