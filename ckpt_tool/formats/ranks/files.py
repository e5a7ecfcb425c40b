"""Which files of a folder are one rank each of a DTensor or ShardedTensor state dict.

verl names them ``model_world_size_N_rank_K.pt`` (beside ``optim_...`` and
``extra_state_...`` files, which are not the model); an FSDP2 model's
``state_dict()`` or FSDP1's ``SHARDED_STATE_DICT`` saved by each rank may be
called anything. A torch.save zip writes ``data.pkl`` first and uncompressed,
so the names of the classes it pickles are in the file's first bytes: the
detection reads at most ``_HEAD`` bytes of a few files, nothing is unpickled.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InputError
from ...io import paths

VERL_MODEL = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")
VERL_OTHER = re.compile(r"(optim|extra_state)_world_size_\d+_rank_\d+\.pt$")
# How torch.save (pickle protocol 2) spells the classes: GLOBAL 'module\nname\n'
MARKERS = (b"torch.distributed.tensor\nDTensor\n", b"torch.distributed._shard.sharded_tensor.api\nShardedTensor\n")
_HEAD = 64 << 10  # a DTensor's class is named at its first use: after ~400 plain tensors at the latest
_PROBE = 4  # files of a folder with other names whose heads are read to detect it
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".tar")


@dataclass(frozen=True)
class RankFiles:
    """The files to read, in name order, and those left out (verl's optimizer and extra-state files)."""

    folder: str
    names: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    verl: bool = False  # named model_world_size_N_rank_K.pt: N and K are checked against the pickles
    # (world size, rank) from each verl name, in the order of ``names``
    named_ranks: tuple[tuple[int, int], ...] = ()


def names_distributed(head: bytes) -> bool:
    """Whether the first bytes of a file are a torch zip whose pickle names DTensor or ShardedTensor."""
    return head.startswith(b"PK\x03\x04") and any(m in head for m in MARKERS)


def _head(path: str, n: int = _HEAD) -> bytes:
    try:
        with paths.open_bytes(path) as data:
            return data.read_upto(0, n)
    except (InputError, OSError):
        return b""


def _listing(folder: str) -> list[str]:
    try:
        names = paths.listdir(folder)
    except InputError:
        return []
    return sorted(n for n in names if not n.startswith(".") and paths.isfile(paths.join(folder, n)))


def is_ranks_folder(folder: str) -> bool:
    """A folder of per-rank DTensor/ShardedTensor files (verl's names, or any names).

    Cheap for the folders that are not: no stat per name (a request each behind a URL), and only names a
    torch.save file may have are probed, ``_HEAD`` bytes of at most ``_PROBE`` of them.
    """
    try:
        names = [n for n in paths.listdir(folder) if not n.startswith(".")]
    except InputError:
        return False
    verl = [n for n in names if VERL_MODEL.match(n)]
    probe = verl[:1] if verl else [n for n in names if n.lower().endswith(_TORCH_SUFFIXES)][:_PROBE]
    return any(names_distributed(_head(paths.join(folder, n))) for n in probe)


def rank_files(folder: str) -> RankFiles:
    """The rank files of ``folder`` (detect.py said it holds some)."""
    names = _listing(folder)
    verl = [n for n in names if VERL_MODEL.match(n)]
    if verl:
        skipped = tuple(n for n in names if n not in verl)
        ranks = tuple((int(m.group(1)), int(m.group(2))) for m in (VERL_MODEL.match(n) for n in verl) if m)
        return RankFiles(folder, tuple(verl), skipped, True, ranks)
    keep = [n for n in names if _head(paths.join(folder, n), 4) == b"PK\x03\x04"]  # the reader reads their pickles
    return RankFiles(folder, tuple(keep), tuple(n for n in names if n not in keep))


def lone_rank_hint(root: object, path: str) -> str | None:
    """What to say when one rank's file is read on its own: its DTensors are records, the model is the folder."""
    from .placement import is_distributed

    if not isinstance(root, dict):
        return None
    kinds = {k for k in (is_distributed(v) for v in root.values()) if k}
    if not kinds:
        return None
    folder = paths.dirname(path) or "."
    return (f"one rank's {' and '.join(sorted(kinds))} shards of a distributed save (listed as metadata, not "
            f"tensors): the model is the folder of every rank's file; run `ckpt inspect {folder}`")
