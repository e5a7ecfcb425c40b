"""Diff's first step: open A, and B as a checkpoint or a ``--target`` module built on the meta device.

Only metadata is read here (with ``--values``, a DCP folder's bytes items
too); the files stay open until run_diff closes them, so that the values
step can stream tensor pairs. A target is the only path that imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...model import Checkpoint, TensorMeta
from .plan import DiffPlan

if TYPE_CHECKING:
    from ...formats import SourceOptions
    from ..inputs import CheckpointInput


@dataclass(frozen=True, kw_only=True)
class Opened:
    """Both sides, read: A's checkpoint, and B's (None for a target) or what the target module holds."""

    a: Checkpoint
    a_label: str
    b: Checkpoint | None  # None: B is a --target module
    b_label: str
    b_tensors: tuple[TensorMeta, ...]
    b_format: str
    lazy: tuple[str, ...] = ()  # the target's uninitialized parameters: any shape loads into them
    plain: tuple[str, ...] = ()  # the target's tensors held as plain attributes
    groups: tuple[tuple[str, ...], ...] = ()  # the target's tied parameters
    target_prefixes: tuple[str, ...] = ()  # the target's attribute paths, for inferring a prefix rewrite
    warnings: tuple[str, ...] = ()  # each side's, prefixed "A: " and "B: " (a target's already say "target")

    def close(self) -> None:
        self.a.close()
        if self.b is not None:
            self.b.close()


def open_side(value: CheckpointInput, source: SourceOptions, *, read_values: bool) -> Checkpoint:
    """One side read with ``source``, a path or (Python API) a state dict or module in memory."""
    from ..inputs import open_input

    return open_input(value, source, read_values=read_values)


def read_sides(plan: DiffPlan) -> Opened:
    """Open A, then B (or build the target); A is closed again when B cannot be read."""
    from ..inputs import label_of

    values = plan.options.values  # --values: a DCP folder's bytes items are read and compared too
    ckpt_a = open_side(plan.a, plan.source, read_values=values)
    try:
        a_label = label_of(plan.a, ckpt_a)
        warnings = tuple(f"A: {w}" for w in ckpt_a.warnings)
        if plan.b is None:
            return _with_target(plan, ckpt_a, a_label, warnings)
        ckpt_b = open_side(plan.b, plan.source_b, read_values=values)
    except BaseException:
        ckpt_a.close()
        raise
    return Opened(a=ckpt_a, a_label=a_label, b=ckpt_b, b_label=label_of(plan.b, ckpt_b),
                  b_tensors=tuple(ckpt_b.tensors), b_format=ckpt_b.format,
                  warnings=warnings + tuple(f"B: {w}" for w in ckpt_b.warnings))


def _with_target(plan: DiffPlan, ckpt_a: Checkpoint, a_label: str, warnings: tuple[str, ...]) -> Opened:
    """B as the ``--target`` module, built on the meta device."""
    from ...tensors.target import build_target, tied_groups

    spec = plan.options.target
    if spec is None:  # diff_plan refuses a plan with neither B nor a target
        raise ValueError("a diff plan without B needs a target")
    built = build_target(spec, plan.options.target_kwargs)
    return Opened(a=ckpt_a, a_label=a_label, b=None, b_label=built.spec, b_tensors=tuple(built.tensors),
                  b_format=f"nn.Module built on {built.device}", lazy=tuple(built.lazy),
                  plain=tuple(built.plain_tensor_attributes), groups=tuple(tied_groups(built.module)),
                  target_prefixes=tuple(built.attribute_prefixes),
                  warnings=warnings + tuple(built.warnings))  # each already says "target ..."
