"""What ``torch.load`` does with a folder: nothing (IsADirectoryError), so the verdict goes file by file.

A sharded set, a DCP folder and a DeepSpeed run are read by loaders that
open their files one at a time, each in its own way: transformers calls
``torch.load(shard, weights_only=True)`` on each ``.bin`` shard and
safetensors reads each ``.safetensors`` shard; torch.distributed.checkpoint
(torch 2.13) unpickles ``.metadata`` with ``pickle.load`` and reads tensor
items with ``torch.load(weights_only=True)``, bytes items with
``weights_only=False``; DeepSpeed reads each rank file with ``torch.load``.
Each FileVerdict names the loader and, for the files torch.load can open,
whether ``torch.load(file, weights_only=True)`` loads it.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import CkptError
from ...format_names import Format
from ...io import is_url, join
from ...model import Checkpoint

TORCH_LOAD, SAFETENSORS, DCP, PICKLE_LOAD, DEEPSPEED, MEGATRON = (
    "torch.load", "safetensors", "torch.distributed.checkpoint", "pickle.load", "deepspeed", "megatron-lm")

# (file's WeightsOnlyInput, torch version) -> (loads, needs, reason, dangerous needs)
PerFile = Callable[[Any, "str | None"], tuple[bool, tuple[str, ...], "str | None", tuple[str, ...]]]


@dataclass(frozen=True)
class FileVerdict:
    """One file of a folder: the loader that reads it and what torch.load(file, weights_only=True) does."""

    path: str  # as the folder or its index names it
    loader: str  # TORCH_LOAD, SAFETENSORS, DCP, PICKLE_LOAD or DEEPSPEED
    loads: bool | None  # torch.load(file, weights_only=True) loads it; None: not a file torch.load opens
    needs: tuple[str, ...] = ()
    reason: str | None = None
    dangerous: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "loader": self.loader, "loads": self.loads, "needs": list(self.needs),
                "reason": self.reason, "dangerous": list(self.dangerous)}

    def line(self) -> str:
        head = f"{self.path}: read by {self.loader}"
        if self.loads is None:
            return f"{head}; {self.reason}" if self.reason else head
        if self.loads:
            verdict = "torch.load(weights_only=True) loads it"
        elif self.dangerous:
            verdict = f"torch.load(weights_only=True) refuses it: needs {', '.join(self.dangerous)}, which can run code"
        elif self.reason:
            verdict = f"torch.load(weights_only=True) refuses it: {self.reason}"
        else:
            verdict = f"torch.load(weights_only=True) refuses it: needs {', '.join(self.needs)}"
        note = f" ({self.reason})" if self.loads and self.reason else ""
        return f"{head}; {verdict}{note}"


@dataclass(frozen=True)
class FolderVerdict:
    reason: str  # why torch.load(path) itself does not load it
    files: tuple[FileVerdict, ...]


def folder_verdict(ck: Checkpoint, torch_version: str | None, per_file: PerFile) -> FolderVerdict | None:
    """The file-by-file verdict for a sharded set, a DCP folder or a DeepSpeed run; None for one file."""
    from ...pickles.torch_rules import SAFETENSORS as ST_INPUT, SHARDED, WeightsOnlyInput

    inp = ck.weights_only
    if isinstance(inp, WeightsOnlyInput) and inp.container == SHARDED:
        files = tuple(_shard(name, part, torch_version, per_file, part is not None and part.container == ST_INPUT)
                      for name, part in sorted(inp.parts, key=lambda p: p[0]))  # read in parallel for a URL
        who = ("each rank loads its own file with torch.load, inside its process group" if ck.format == Format.RANKS
               else "the files its index names are read one by one")
        return FolderVerdict(_not_a_file(ck.path, who), files)
    if ck.format == Format.DCP:
        return FolderVerdict(_not_a_file(ck.path, "torch.distributed.checkpoint.load reads it"), _dcp_files(ck))
    if ck.format == Format.DEEPSPEED:
        return FolderVerdict(_not_a_file(ck.path, "DeepSpeed's load_checkpoint reads its rank files with torch.load"),
                             _rank_files(ck, "deepspeed", DEEPSPEED, torch_version, per_file))
    if ck.format == Format.MEGATRON_LEGACY:
        return FolderVerdict(_not_a_file(ck.path, "Megatron-LM's load_checkpoint reads each rank's file with "
                                         "torch.load"), _rank_files(ck, "megatron", MEGATRON, torch_version, per_file))
    return None


def _not_a_file(path: str, who: str) -> str:
    if path.endswith(".json"):
        return f"an index (JSON, not a pickle): torch.load cannot read it (it raises UnpicklingError); {who}"
    return f"a folder: torch.load cannot open it (it raises IsADirectoryError); {who}"


def _shard(name: str, part: Any, torch_version: str | None, per_file: PerFile, safetensors: bool) -> FileVerdict:
    loader = SAFETENSORS if safetensors else TORCH_LOAD
    if part is None:
        return FileVerdict(name, loader, None, reason="not predicted (ckpt did not read this shard)")
    loads, needs, reason, dangerous = per_file(part, torch_version)
    if safetensors and loads:
        reason = "holds no pickle; torch 2.13's torch.load hands a *.safetensors path to safetensors"
    return FileVerdict(name, loader, loads, needs, reason, dangerous)


def _dcp_files(ck: Checkpoint) -> tuple[FileVerdict, ...]:
    shards = ck.metadata.get("shards")
    names = [s for s in shards if isinstance(s, str)] if isinstance(shards, (list, tuple)) else []
    out = [FileVerdict(".metadata", PICKLE_LOAD, None, reason=(
        "torch.distributed.checkpoint unpickles it with pickle.load: weights_only does not apply, every "
        "global it names is imported and called (ckpt scan judges them)"))]
    out += [FileVerdict(n, DCP, None, reason=(
        "tensor items are read with torch.load(weights_only=True), bytes items with "
        "torch.load(weights_only=False) (ckpt scan judges their pickles)")) for n in names]
    return tuple(out)


def _rank_files(ck: Checkpoint, record: str, loader: str, torch_version: str | None,
                per_file: PerFile) -> tuple[FileVerdict, ...]:
    """Each rank file its reader recorded (``metadata[record]``: folder, files), its pickle read again (without
    its tensor bytes) for the prediction."""
    from ...formats import ReadOptions, read_file

    meta = ck.metadata.get(record)
    if not isinstance(meta, dict):
        return ()
    folder = str(meta.get("folder") or ck.path)
    out = []
    for name in meta.get("files") or ():
        full = join(folder, str(name))
        shown = _relative(full, ck.path, folder)
        try:
            loaded = read_file(full, ReadOptions(walk=False))
        except CkptError as exc:
            out.append(FileVerdict(shown, loader, None, reason=f"not predicted: {exc.message}"))
            continue
        try:
            if loaded.weights_only is None:
                out.append(FileVerdict(shown, loader, None, reason="not predicted"))
            else:
                loads, needs, reason, dangerous = per_file(loaded.weights_only, torch_version)
                out.append(FileVerdict(shown, loader, loads, needs, reason, dangerous))
        finally:
            for source in loaded.sources:
                source.close()
    return tuple(out)


def _relative(full: str, top: str, folder: str) -> str:
    """``full`` as seen from the input the user named (a run folder or its tag folder), URL or not."""
    if is_url(full):
        for base in (top, folder):
            prefix = base.rstrip("/") + "/"
            if full.startswith(prefix):
                return full[len(prefix):]
        return full
    return os.path.relpath(full, top if os.path.isdir(top) else folder)


__all__ = ["DCP", "DEEPSPEED", "MEGATRON", "PICKLE_LOAD", "SAFETENSORS", "TORCH_LOAD", "FileVerdict", "FolderVerdict",
           "folder_verdict"]
