"""How a source is read: the one frozen value every command passes to the readers.

The CLI builds it once from the shared options (``cli/options.py``:
``source_options``); the public API builds it from the same keyword names.
Readers and commands take it whole, so an option added here reaches every
reader without another parameter in each signature between.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from .tp import TpRules


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """What the user said about reading a checkpoint, parsed and checked once."""

    key: str | None = None  # where the state_dict is inside the container (dotted path)
    unsafe: bool = False  # unpickle with torch.load: runs code from the file
    limits: Limits = DEFAULT_LIMITS
    tp_rules: TpRules | None = None  # --tp-rules FILE, parsed: how tensor-parallel shards merge
    unstack_layers: bool = False  # a Megatron torch_dist checkpoint's stacked layers under per-layer names
    torch_version: str | None = None  # whose weights_only rules predict torch.load (None: installed, else newest)
    download: bool = False  # a URL source is downloaded whole first (--download) instead of read by ranges

    def with_key(self, key: str | None) -> SourceOptions:
        """The same options selecting another state_dict (diff's --key-b)."""
        return replace(self, key=key)


DEFAULT_SOURCE = SourceOptions()
