"""torch's own DCP writer, in one process: ``dcp.save(..., no_dist=True)`` of an in-memory state_dict.

writers/dcp.py builds the state_dict (tied tensors stay one tensor); the
call into torch.distributed.checkpoint is here, in the torch adapter.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

from ...model import TensorMeta
from ..numerics import CastLoss, cast_tensor


def load_for_save(meta: TensorMeta, cast: str | None) -> tuple[object, CastLoss | None]:
    """A CPU torch tensor holding ``meta``'s data, cast to ``cast`` when given (and what the cast lost)."""
    from ..data import to_torch

    if cast is None:
        return to_torch(meta), None
    return cast_tensor(meta, cast)


def save_dcp(folder: str, state_dict: Mapping[str, object]) -> None:
    """``.metadata`` and ``__0_0.distcp`` of ``state_dict`` into ``folder``, files fsynced."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True)
    with warnings.catch_warnings():
        # one process is the intent here; torch warns that it assumes so
        warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process.*")
        save(dict(state_dict), storage_writer=writer, no_dist=True)
