"""Diff's plan: what ``diff(...)`` was asked, as frozen, typed values checked once before either side is read.

How each side is read is the readers' ``SourceOptions`` (formats/options.py:
key, unsafe, limits, tp_rules parsed, torch_version, ...); what diff compares
and how is ``DiffOptions``. ``diff_plan`` checks them against each other and
the steps (commands/diff/steps.py) read the plan, never a keyword list.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import UsageError
from ...formats import DEFAULT_SOURCE, SourceOptions
from ...progress import NO_PROGRESS, Progress
from .report import PLAIN_VIEW, ValueView

if TYPE_CHECKING:
    from ...keys import RuleSet
    from ...tensors.target import TargetSpec
    from ..inputs import CheckpointInput


@dataclass(frozen=True, kw_only=True)
class DiffOptions:
    """What diff compares and how; how each side is read is the SourceOptions beside it."""

    target: TargetSpec | None = None  # B as a module (SPEC, class or instance) instead of a checkpoint
    target_kwargs: Mapping[str, object] | None = None  # the target class's constructor arguments
    key_b: str | None = None  # B's state_dict, when it is not where SourceOptions.key says A's is
    values: bool = False  # read and compare the data of every common key of equal shape
    atol: float = 1e-8
    rtol: float = 1e-5
    fail_on_metadata: bool = False  # metadata differences count against ``equal``
    rules: RuleSet | None = None  # rewrite A's keys first, as ``ckpt migrate`` would
    auto: bool = False  # then infer and apply the rewrite that makes A's keys match B's
    view: ValueView = PLAIN_VIEW  # the order, cut, rollups and histograms of the --values figures


DEFAULT_DIFF = DiffOptions()


@dataclass(frozen=True)
class DiffHooks:
    """The caller's callbacks: where the pairs compared with --values are counted ("comparing values")."""

    progress: Progress = NO_PROGRESS


NO_HOOKS = DiffHooks()


@dataclass(frozen=True, kw_only=True)
class DiffPlan:
    """A diff that passed its checks: the two inputs, how they are read and what is compared."""

    a: CheckpointInput
    b: CheckpointInput | None  # None: B is ``options.target``
    source: SourceOptions = DEFAULT_SOURCE
    options: DiffOptions = DEFAULT_DIFF

    @property
    def source_b(self) -> SourceOptions:
        """How B is read: A's options, selecting ``--key-b`` when one is given."""
        key_b = self.options.key_b
        return self.source if key_b is None else self.source.with_key(key_b)


def check_options(b_given: bool, options: DiffOptions) -> None:
    """Refuse options that contradict each other (exit 2), in the order the CLI has always checked them."""
    if b_given == (options.target is not None):
        raise UsageError("give either a second checkpoint B or --target SPEC (exactly one)")
    if options.values and options.target is not None:
        raise UsageError("--values compares two checkpoints; a --target module built on the meta device "
                         "holds no values")
    if options.key_b is not None and options.target is not None:
        raise UsageError("--key-b selects inside a second checkpoint B; a --target module has no container")
    if _orders_figures(options.view) and not options.values:
        raise UsageError("--sort, --top, --rollup-depth, --rollup-layers and --html order or summarise the "
                         "--values figures: add --values")
    atol, rtol = options.atol, options.rtol
    if atol < 0 or rtol < 0 or math.isnan(atol) or math.isnan(rtol):
        raise UsageError("--atol and --rtol must be non-negative numbers")


def _orders_figures(view: ValueView) -> bool:
    """The view asks for something only the --values figures have (an order, a cut, rollups, histograms)."""
    return (view.sort is not None or view.top is not None or view.rollup_depth is not None or view.rollup_layers
            or bool(view.histograms))


def diff_plan(a: CheckpointInput, b: CheckpointInput | None, source: SourceOptions = DEFAULT_SOURCE,
              options: DiffOptions = DEFAULT_DIFF) -> DiffPlan:
    """The plan of comparing ``a`` with ``b`` (or with ``options.target``), once its options are checked."""
    check_options(b is not None, options)
    return DiffPlan(a=a, b=b, source=source, options=options)
