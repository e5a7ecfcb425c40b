"""``ckpt diff``: what happens when A's weights are loaded where B is expected."""

# The surface siblings and users import (``from ckpt_tool.commands.diff import diff`` as before the
# package split); the modules below it are the feature's own.
from .command import compare_tensors, diff, run_diff
from .plan import DiffHooks, DiffOptions, DiffPlan, diff_plan
from .report import DiffReport, ValueView
from .rollup import Rollup

__all__ = ["DiffHooks", "DiffOptions", "DiffPlan", "DiffReport", "Rollup", "ValueView", "compare_tensors", "diff",
           "diff_plan", "run_diff"]
