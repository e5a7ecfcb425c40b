"""``diff --values`` figures per module: sorting and cutting the per-tensor list, and rollups that add up.

A rollup is computed from each tensor's float64 sums (tensors/closeness.py
ValueDiff), never from its ratios, so a group's figures are exactly those of
the concatenation of its tensors: ``mean_abs`` = sum |d| / sum numel
(element-weighted), ``rel_l2`` = sqrt(sum ||B-A||^2) / sqrt(sum ||A||^2),
``cosine`` = sum a.b / (||A|| ||B||) over the group, max_abs and max_rel the
largest, counts summed. Torch-free: it only reads the ValueDiffs.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...format_names import DiffMetric
from ...tensors.numerics import SumFigures, ValueDiff, json_float, worst

Metric = DiffMetric  # the name used in this package


@dataclass(frozen=True)
class Rollup(SumFigures):
    """The figures of one group of tensors (a module prefix, or a key with its layer index folded)."""

    name: str
    tensors: int
    numel: int
    max_abs: float
    max_rel: float
    sum_abs: float
    sq_diff: float
    sq_a: float
    sq_b: float
    dot: float
    mismatched: int
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    same: bool  # every tensor of the group equal

    def all_equal(self) -> bool:
        return self.same

    @property
    def key(self) -> str:  # so that sort_key treats rollups and tensors alike
        return self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "tensors": self.tensors, "numel": self.numel,
            "max_abs": json_float(self.max_abs), "max_rel": json_float(self.max_rel),
            "mean_abs": json_float(self.mean_abs), "rel_l2": json_float(self.rel_l2),
            "cosine": json_float(self.cosine), "mismatched": self.mismatched,
            "mismatched_share": self.mismatched_share,
            "nan_a": self.nan_a, "nan_b": self.nan_b, "inf_a": self.inf_a, "inf_b": self.inf_b,
        }


AGGREGATION = {  # how each rollup figure comes from its tensors' (docs/diff.md shows this table)
    "numel": "sum",
    "max_abs": "max",
    "max_rel": "max",
    "mean_abs": "sum |B-A| / sum numel (element-weighted)",
    "rel_l2": "sqrt(sum ||B-A||^2) / sqrt(sum ||A||^2) (the group as one vector)",
    "cosine": "sum A.B / (||A|| ||B||) (the group as one vector)",
    "mismatched_share": "sum mismatched / sum numel (element-weighted)",
    "nan/inf": "sum",
}


def metric_value(v: ValueDiff | Rollup, metric: Metric) -> float:
    """``metric`` of a tensor or a rollup, as a number (NaN counts as the largest change)."""
    if metric is Metric.NUMEL:
        return float(v.numel)
    x = float(getattr(v, metric.value))
    return math.inf if x != x else x


def sort_key(metric: Metric) -> Any:
    """A key for ``sorted`` that puts the largest change first (then the key, for a stable order)."""
    if metric is Metric.KEY:
        return lambda v: v.key
    if metric is Metric.COSINE:
        return lambda v: (_nan_low(v.cosine), v.key)
    return lambda v: (-metric_value(v, metric), v.key)


def _nan_low(x: float) -> float:
    return -math.inf if x != x else x


def ordered(items: Iterable[Any], metric: Metric | None, top: int | None) -> list[Any]:
    """``items`` (ValueDiffs or Rollups) in ``metric`` order (as given when None), cut to ``top``."""
    out = list(items)
    if metric is not None:
        out.sort(key=sort_key(metric))
    return out[:top] if top is not None else out


_INDEX = re.compile(r"^\d+$")


def fold_layers(key: str) -> str:
    """``model.layers.3.attn.q.weight`` -> ``model.layers.*.attn.q.weight``: every all-digit part becomes ``*``."""
    return ".".join("*" if _INDEX.match(p) else p for p in key.split("."))


def module_of(key: str, depth: int) -> str:
    """The first ``depth`` dotted parts of ``key`` (the whole key when it has fewer; depth 0: "(all)")."""
    if depth <= 0:
        return "(all)"
    return ".".join(key.split(".")[:depth])


def layer_and_role(key: str) -> tuple[int, str] | None:
    """(layer index, parameter role) of ``model.layers.3.attn.q.weight``: (3, ``model.layers.*.attn.q.weight``);
    None for a key with no all-digit part (an embedding, the head). The first index is the layer; the role
    keeps the path before it, so that two stacks (``encoder.layers.3``, ``decoder.layers.3``) stay apart."""
    parts = key.split(".")
    for i, p in enumerate(parts):
        if _INDEX.match(p):
            return int(p), ".".join([*parts[:i], "*", *parts[i + 1:]])
    return None


def common_prefix(names: Sequence[str]) -> str:
    """The dotted parts every name starts with (``model.layers.*.``), to leave out of labels; "" if none."""
    if not names:
        return ""
    split = [n.split(".") for n in names]
    shared = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        shared.append(parts[0])
    if len(shared) >= min(len(p) for p in split):  # a name would be left empty
        shared = shared[:-1]
    return ".".join(shared) + "." if shared else ""


def rollups(values: Sequence[ValueDiff], *, depth: int | None, fold: bool) -> list[Rollup]:
    """Groups of ``values`` by module prefix (``depth`` parts) and/or with layer indices folded, in key order
    of their first tensor. Every tensor is in exactly one group, so the groups' sums add up to the total's."""
    groups: dict[str, list[ValueDiff]] = {}
    for v in values:
        name = fold_layers(v.key) if fold else v.key
        if depth is not None:
            name = module_of(name, depth)
        groups.setdefault(name, []).append(v)
    return [combine(name, members) for name, members in groups.items()]


def combine(name: str, members: Sequence[ValueDiff]) -> Rollup:
    """One Rollup from its tensors' sums (the module docstring says how each figure is aggregated)."""
    max_abs = max_rel = 0.0
    for v in members:
        max_abs, max_rel = worst(max_abs, v.max_abs), worst(max_rel, v.max_rel)
    return Rollup(
        name=name, tensors=len(members), numel=sum(v.numel for v in members), max_abs=max_abs, max_rel=max_rel,
        sum_abs=math.fsum(v.sum_abs for v in members), sq_diff=math.fsum(v.sq_diff for v in members),
        sq_a=math.fsum(v.sq_a for v in members), sq_b=math.fsum(v.sq_b for v in members),
        dot=math.fsum(v.dot for v in members), mismatched=sum(v.mismatched for v in members),
        nan_a=sum(v.nan_a for v in members), nan_b=sum(v.nan_b for v in members),
        inf_a=sum(v.inf_a for v in members), inf_b=sum(v.inf_b for v in members),
        same=all(v.same for v in members),
    )
