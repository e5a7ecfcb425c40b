"""torch.distributed.checkpoint folders, written by torch's own DCP writer in one process.

DCP has no streaming entry point: the state_dict is materialised in memory
(tied tensors stay one tensor), then ``dcp.save(..., no_dist=True)`` writes
``.metadata`` and ``__0_0.distcp`` into the (temporary) folder.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .base import OutTensor

DCP_SUFFIXES = (".distcp", ".metadata")


def materialise(tensors: Sequence[OutTensor]) -> dict[str, Any]:
    """Torch tensors for the output, one object per tied group."""
    import torch

    from ..tensors.castloss import cast_with_loss
    from ..tensors.tensordata import to_torch

    out: dict[str, Any] = {}
    by_view: dict[object, Any] = {}
    for t in tensors:
        vk = t.view_key()
        x = by_view.get(vk) if vk is not None else None
        if x is None:
            x = to_torch(t.source)
            if t.cast:
                x, loss = cast_with_loss(x, getattr(torch, t.dtype))
                t.loss = loss
            if vk is not None:
                by_view[vk] = x
        out[t.key] = x
    return out


def write_dcp(folder: str, tensors: Sequence[OutTensor], on_bytes: Callable[[int], None] | None = None) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    state_dict = materialise(tensors)
    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True)
    with warnings.catch_warnings():
        # one process is the intent here; torch warns that it assumes so
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
        save(state_dict, storage_writer=writer, no_dist=True)
    if on_bytes is not None:
        on_bytes(sum(t.nbytes for t in tensors))
