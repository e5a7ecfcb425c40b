"""safetensors outputs: one file, or a sharded set with its index."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .sharded import (
        INDEX_NAME as INDEX_NAME,
        Shard as Shard,
        index_bytes as index_bytes,
        parse_size as parse_size,
        plan_shards as plan_shards,
        write_shard as write_shard,
        write_sharded as write_sharded,
    )
    from .single import (
        Follower as Follower,
        header_bytes as header_bytes,
        write_body as write_body,
        write_safetensors as write_safetensors,
    )
    from .writer import (
        SafetensorsWriter as SafetensorsWriter,
        ShardedWriter as ShardedWriter,
        oversized as oversized,
        payload_of as payload_of,
        refuse_held as refuse_held,
        shape_flat as shape_flat,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "sharded": ("INDEX_NAME", "Shard", "index_bytes", "parse_size", "plan_shards", "write_shard", "write_sharded"),
    "single": ("Follower", "header_bytes", "write_body", "write_safetensors"),
    "writer": ("SafetensorsWriter", "ShardedWriter", "oversized", "payload_of", "refuse_held", "shape_flat"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "INDEX_NAME",
    "Follower",
    "SafetensorsWriter",
    "Shard",
    "ShardedWriter",
    "header_bytes",
    "index_bytes",
    "oversized",
    "parse_size",
    "payload_of",
    "plan_shards",
    "refuse_held",
    "shape_flat",
    "write_body",
    "write_safetensors",
    "write_shard",
    "write_sharded",
]
