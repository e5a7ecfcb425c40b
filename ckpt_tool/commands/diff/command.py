"""``ckpt diff``: what happens when A's weights are loaded where B is expected.

``run_diff`` runs a checked plan (plan.py) as steps: read both sides
(read.py), rewrite A's keys, compare keys, metadata and values, suggest the
fix (steps.py), and puts their typed parts together (parts.py, report.py).
Key, shape and dtype differences follow ``load_state_dict`` and come from
metadata alone; when both sides are checkpoints nothing here imports torch.
``values`` streams tensor pairs one at a time (tensors/numerics) and is the
only step that reads tensor bytes. A ``--target`` is a module built on the
meta device (tensors/target), which of course imports torch.
"""
from __future__ import annotations

import os
from dataclasses import replace

from ...io import remote_session
from .parts import KeyDiff, MetadataDiff, Sides, ValueFigures, WeightsOnlyPair
from .plan import NO_HOOKS, DiffHooks, DiffOptions, DiffPlan, diff_plan
from .read import Opened, read_sides
from .report import DiffReport
from .steps import (
    Fix,
    Found,
    Rewrite,
    compare_figures,
    compare_keys,
    compare_metadata,
    compare_tensors,
    rewrite_keys,
    suggest_fix,
)


def run_diff(plan: DiffPlan, hooks: DiffHooks = NO_HOOKS) -> DiffReport:
    """Run the diff ``plan``: read both sides, rewrite A's keys, compare keys, metadata and values, suggest the fix.

    When a side is a URL, the report's ``remote`` says what reading it cost (requests, bytes).
    """
    paths = [os.fspath(v) for v in (plan.a, plan.b) if isinstance(v, (str, os.PathLike))]
    with remote_session(*paths) as counted:
        report = _run_steps(plan, hooks)
    return report if counted is None else replace(report, remote=counted.stats())


def _run_steps(plan: DiffPlan, hooks: DiffHooks) -> DiffReport:
    sides = read_sides(plan)
    try:
        a = rewrite_keys(plan, sides)
        keys = compare_keys(sides, a)
        metadata = compare_metadata(sides)
        figures = compare_figures(plan, sides, a, keys.part, hooks)
        fix = suggest_fix(sides, a, keys.part)
    finally:
        sides.close()
    return _report(plan, sides, a, keys, metadata, figures, fix)


def _report(plan: DiffPlan, sides: Opened, a: Rewrite, keys: Found[KeyDiff], metadata: Found[MetadataDiff],
            figures: Found[ValueFigures], fix: Fix) -> DiffReport:
    """The steps' parts as one report; each side's weights_only prediction is made from what was read."""
    from ..loads_check import assess

    options, version = plan.options, plan.source.torch_version
    what = Sides(a=sides.a_label, b=sides.b_label, b_kind="target" if sides.b is None else "checkpoint",
                 a_format=sides.a.format, b_format=sides.b_format, a_count=len(sides.a.tensors),
                 b_count=len(sides.b_tensors), key=plan.source.key, key_b=options.key_b,
                 target_kwargs=dict(options.target_kwargs or {}), plain_tensor_attributes=sides.plain)
    warnings = sides.warnings + keys.warnings + metadata.warnings + figures.warnings
    wo = WeightsOnlyPair(assess(sides.a, version), assess(sides.b, version) if sides.b is not None else None)
    return DiffReport(sides=what, keys=keys.part, figures=figures.part, rewrite=replace(a.applied, fix=fix.rules),
                      metadata=metadata.part, suggestion=fix.suggestion, weights_only=wo, warnings=warnings,
                      fail_on_metadata=options.fail_on_metadata)


__all__ = ["DiffHooks", "DiffOptions", "DiffPlan", "compare_tensors", "diff_plan", "run_diff"]
