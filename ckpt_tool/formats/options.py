"""How a source is read: the one frozen value every command passes to the readers.

The CLI builds it once from the shared options (``cli/options.py``:
``source_options``); the public API builds it from the same keyword names.
Readers and commands take it whole, so an option added here reaches every
reader without another parameter in each signature between.

Each field is declared once, in a small base class of its own, because the
Python verbs take the same keywords (commands/keywords.py): a verb's keyword
arguments are the fields of a dataclass that inherits the bases of the
options it offers (gate offers no ``unsafe``), so neither the names nor their
types and defaults are written twice.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from .tp import TpRules


@dataclass(frozen=True, kw_only=True)
class Keyed:
    key: str | None = None  # where the state_dict is inside the container (dotted path)


@dataclass(frozen=True, kw_only=True)
class Unpickling:
    unsafe: bool = False  # unpickle with torch.load: runs code from the file


@dataclass(frozen=True, kw_only=True)
class Limited:
    limits: Limits = DEFAULT_LIMITS  # the readers' safety limits (the --max-* options)


@dataclass(frozen=True, kw_only=True)
class Predicting:
    torch_version: str | None = None  # whose weights_only rules predict torch.load (None: installed, else newest)


@dataclass(frozen=True, kw_only=True)
class Unstacking:
    unstack_layers: bool = False  # a Megatron torch_dist checkpoint's stacked layers under per-layer names


@dataclass(frozen=True, kw_only=True)
class TpRulesFile:
    """A Python caller's --tp-rules: the file, which commands/keywords.py parses into SourceOptions.tp_rules."""

    tp_rules: str | os.PathLike[str] | None = None  # a TOML file: how tensor-parallel shards merge


@dataclass(frozen=True, kw_only=True)
class SourceOptions(Unstacking, Predicting, Limited, Unpickling, Keyed):  # fields in this order, reversed
    """What the user said about reading a checkpoint, parsed and checked once."""

    tp_rules: TpRules | None = None  # --tp-rules FILE, parsed: how tensor-parallel shards merge
    download: bool = False  # a URL source is downloaded whole first (--download) instead of read by ranges

    def with_key(self, key: str | None) -> SourceOptions:
        """The same options selecting another state_dict (diff's --key-b)."""
        return replace(self, key=key)


DEFAULT_SOURCE = SourceOptions()
