"""safetensors outputs: one file, or a sharded set with its index."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .sharded import (
        INDEX_NAME as INDEX_NAME,
    )
    from .sharded import (
        Shard as Shard,
    )
    from .sharded import (
        index_bytes as index_bytes,
    )
    from .sharded import (
        parse_size as parse_size,
    )
    from .sharded import (
        plan_shards as plan_shards,
    )
    from .sharded import (
        write_shard as write_shard,
    )
    from .sharded import (
        write_sharded as write_sharded,
    )
    from .single import (
        Follower as Follower,
    )
    from .single import (
        header_bytes as header_bytes,
    )
    from .single import (
        write_body as write_body,
    )
    from .single import (
        write_safetensors as write_safetensors,
    )
    from .writer import (
        SafetensorsWriter as SafetensorsWriter,
    )
    from .writer import (
        ShardedWriter as ShardedWriter,
    )
    from .writer import (
        oversized as oversized,
    )
    from .writer import (
        payload_of as payload_of,
    )
    from .writer import (
        refuse_held as refuse_held,
    )
    from .writer import (
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
