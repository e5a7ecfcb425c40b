"""Tensor-parallel shards merged into whole tensors by rules (DeepSpeed runs, Megatron-LM legacy folders).

The rules come from the run (``universal_checkpoint_info``) or from the
user (``--tp-rules FILE``); the merge is byte ranges, no tensor assembled.
``merge_ranks`` is imported on first use (PEP 562): a command that only
parses a rules file does not import the merge.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .tprules import UC_INFO, TpRule, TpRules, from_universal_info, load_rules, parse_rules

if TYPE_CHECKING:
    from .tpmerge import merge_ranks


def __getattr__(name: str) -> Any:
    if name == "merge_ranks":
        from .tpmerge import merge_ranks

        return merge_ranks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["UC_INFO", "TpRule", "TpRules", "from_universal_info", "load_rules", "merge_ranks", "parse_rules"]
