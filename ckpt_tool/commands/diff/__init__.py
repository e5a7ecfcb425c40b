"""``ckpt diff``: what happens when A's weights are loaded where B is expected.

A plan (plan.py: SourceOptions + DiffOptions, checked once) run as steps
(read.py, steps.py: read -> rewrite keys -> compare keys -> metadata ->
values -> suggestion), each giving one typed part of the report (parts.py).
"""

# The surface siblings and users import (``from ckpt_tool.commands.diff import diff`` as before the
# package split); the modules below it are the feature's own.
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .call import DiffCall, diff
from .command import compare_tensors, run_diff
from .parts import (
    PLAIN_VIEW,
    KeyDiff,
    MetadataChange,
    MetadataDiff,
    MetadataOnly,
    Mismatch,
    RulesApplied,
    Sides,
    ValueFigures,
    ValueView,
    WeightsOnlyPair,
)
from .plan import DiffHooks, DiffOptions, DiffPlan, diff_plan
from .report import DiffReport
from .rollup import Rollup

if TYPE_CHECKING:
    from .rollup import common_prefix as common_prefix, layer_and_role as layer_and_role, ordered as ordered

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "rollup": ("common_prefix", "layer_and_role", "ordered"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "PLAIN_VIEW",
    "DiffCall",
    "DiffHooks",
    "DiffOptions",
    "DiffPlan",
    "DiffReport",
    "KeyDiff",
    "MetadataChange",
    "MetadataDiff",
    "MetadataOnly",
    "Mismatch",
    "Rollup",
    "RulesApplied",
    "Sides",
    "ValueFigures",
    "ValueView",
    "WeightsOnlyPair",
    "call",
    "common_prefix",
    "compare_tensors",
    "diff",
    "diff_plan",
    "layer_and_role",
    "ordered",
    "run_diff",
]
