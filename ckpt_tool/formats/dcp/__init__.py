"""torch.distributed.checkpoint (DCP) folders: listed from ``.metadata``, streamed from the shard files."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .deferred import with_values as with_values
    from .items import BytesItem as BytesItem
    from .metadata import METADATA as METADATA, ItemRegion as ItemRegion, dcp_regions as dcp_regions
    from .stream import (
        Chunk as Chunk,
        DcpStreamSource as DcpStreamSource,
        StreamedOrAssembled as StreamedOrAssembled,
        place_chunk as place_chunk,
        row_order as row_order,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "deferred": ("with_values",),
    "items": ("BytesItem",),
    "metadata": ("ItemRegion", "METADATA", "dcp_regions"),
    "stream": ("Chunk", "DcpStreamSource", "StreamedOrAssembled", "place_chunk", "row_order"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "METADATA",
    "BytesItem",
    "Chunk",
    "DcpStreamSource",
    "ItemRegion",
    "StreamedOrAssembled",
    "dcp_regions",
    "place_chunk",
    "row_order",
    "with_values",
]
