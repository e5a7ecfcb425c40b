"""Tensor-parallel shards merged into whole tensors by rules (DeepSpeed runs, Megatron-LM legacy folders).

The rules come from the run (``universal_checkpoint_info``) or from the
user (``--tp-rules FILE``); the merge is byte ranges, no tensor assembled.
``merge_ranks`` is imported on first use (ckpt_tool/lazy.py): a command that
only parses a rules file does not import the merge.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .tprules import UC_INFO, TpRule, TpRules, from_universal_info, load_rules, parse_rules

if TYPE_CHECKING:
    from .tpmerge import merge_ranks as merge_ranks

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "tpmerge": ("merge_ranks",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["UC_INFO", "TpRule", "TpRules", "from_universal_info", "load_rules", "merge_ranks", "parse_rules"]
