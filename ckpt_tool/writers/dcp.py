"""torch.distributed.checkpoint folders, written by torch's own DCP writer in one process.

DCP has no streaming entry point: the state_dict is materialised in memory
(tied tensors stay one tensor), then ``dcp.save(..., no_dist=True)`` writes
``.metadata`` and ``__0_0.distcp`` into the (temporary) folder.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import dtypes
from ..errors import RuleConflict
from ..tensors.runtime import load_for_save, save_dcp
from .base import OutTensor

DCP_SUFFIXES = (".distcp", ".metadata")


def check_dtypes(tensors: Sequence[OutTensor]) -> None:
    """torch 2.13's DCP planner has no element size for the bits types (torch._utils._element_size raises):
    refuse before writing."""
    for t in tensors:
        if dtypes.lookup(t.dtype).kind == "bits":
            raise RuleConflict(f"a dcp output cannot hold {t.dtype} (tensor {t.key!r}): torch.distributed."
                               "checkpoint cannot save the bits types; write a .pth")


def materialise(tensors: Sequence[OutTensor]) -> dict[str, object]:
    """Torch tensors for the output, one object per tied group."""
    out: dict[str, object] = {}
    by_view: dict[object, object] = {}
    for t in tensors:
        vk = t.view_key()
        x = by_view.get(vk) if vk is not None else None
        if x is None:
            x, loss = load_for_save(t.source, t.dtype if t.cast else None)
            if loss is not None:
                t.loss = loss
            if vk is not None:
                by_view[vk] = x
        out[t.key] = x
    return out


def write_dcp(folder: str, tensors: Sequence[OutTensor], on_bytes: Callable[[int], None] | None = None) -> None:
    save_dcp(folder, materialise(tensors))
    if on_bytes is not None:
        on_bytes(sum(t.nbytes for t in tensors))
