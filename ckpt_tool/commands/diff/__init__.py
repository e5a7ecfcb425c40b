"""``ckpt diff``: what happens when A's weights are loaded where B is expected.

A plan (plan.py: SourceOptions + DiffOptions, checked once) run as steps
(read.py, steps.py: read -> rewrite keys -> compare keys -> metadata ->
values -> suggestion), each giving one typed part of the report (parts.py).
"""

# The surface siblings and users import (``from ckpt_tool.commands.diff import diff`` as before the
# package split); the modules below it are the feature's own.
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

__all__ = ["PLAIN_VIEW", "DiffCall", "DiffHooks", "DiffOptions", "DiffPlan", "DiffReport", "KeyDiff", "MetadataChange",
           "MetadataDiff", "MetadataOnly", "Mismatch", "Rollup", "RulesApplied", "Sides", "ValueFigures", "ValueView",
           "WeightsOnlyPair", "compare_tensors", "diff", "diff_plan", "run_diff"]
