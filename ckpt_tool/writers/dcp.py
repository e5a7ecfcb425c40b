"""torch.distributed.checkpoint folders, written by torch's own DCP writer in one process.

DCP has no streaming entry point: the state_dict is materialised in memory
(tied tensors stay one tensor), then ``dcp.save(..., no_dist=True)`` writes
``.metadata`` and ``__0_0.distcp`` into the (temporary) folder.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import dtypes
from ..errors import RuleConflict
from ..format_names import OutputFormat
from .base import OutTensor
from .interface import Reread, Shaped, ShapeRequest, WriteRequest, Written, folder_of

if TYPE_CHECKING:
    from ..io.atomic import AtomicDir, AtomicFile

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
    from ..tensors.runtime import load_for_save

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
    from ..tensors.runtime import save_dcp

    save_dcp(folder, materialise(tensors))
    if on_bytes is not None:
        on_bytes(sum(t.nbytes for t in tensors))


# torch's records, since its writer cannot be asked in advance: about 1.6 KB per tensor in the data file and 200 bytes
# per tensor plus the key in ``.metadata``, as measured with torch 2.13; 2 KiB and 512 bytes are counted
DCP_DATA_PER_TENSOR = 2048
DCP_METADATA_PER_TENSOR = 512
DCP_FIXED = 16384


def dcp_sizes(tensors: Sequence[OutTensor]) -> list[int]:
    data = sum(t.nbytes + DCP_DATA_PER_TENSOR for t in tensors)
    meta = DCP_FIXED + sum(DCP_METADATA_PER_TENSOR + 2 * len(t.key.encode("utf-8")) for t in tensors)
    return [data, meta]


class DcpWriter:
    """A torch.distributed.checkpoint folder, written by torch in this process; the state_dict only."""

    format = OutputFormat.DCP
    names = ("dcp",)
    extensions: tuple[str, ...] = ()
    folder = True
    shared = False
    suffixes = DCP_SUFFIXES
    reread: Reread = "checkpoint"

    def shape(self, request: ShapeRequest) -> Shaped:
        from .safetensors import refuse_held

        refuse_held(request, self.format)
        check_dtypes(request.tensors)
        if not request.state_dict_only and request.ck.layout == "container":
            return Shaped(payload=None,
                          warnings=("a DCP output holds the state_dict only; the other entries were not kept",))
        return Shaped(payload=None)

    def sizes(self, request: WriteRequest) -> list[int]:
        return dcp_sizes(request.tensors)

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        return sum(dcp_sizes(request.tensors)), 2

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        p = request.progress
        p.start("writing", sum(t.nbytes for t in request.tensors))
        write_dcp(folder_of(into).path, request.tensors, p.advance)
        return Written()
