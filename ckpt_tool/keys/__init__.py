
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .infer import Suggestion as Suggestion, suggest as suggest
    from .prefixes import detect_prefixes as detect_prefixes
    from .rules import (
        Plan as Plan,
        RuleSet as RuleSet,
        load_rules_file as load_rules_file,
        make_plan as make_plan,
        parse_rename as parse_rename,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "infer": ("Suggestion", "suggest"),
    "prefixes": ("detect_prefixes",),
    "rules": ("Plan", "RuleSet", "load_rules_file", "make_plan", "parse_rename"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "Plan", "RuleSet", "Suggestion", "detect_prefixes", "load_rules_file", "make_plan", "parse_rename", "suggest",
]
