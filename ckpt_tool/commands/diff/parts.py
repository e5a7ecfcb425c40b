"""The typed parts of a DiffReport, one per question diff answers, each filled by one step (steps.py).

Sides (what was compared), keys (what load_state_dict would say), the
``--values`` figures, the rules applied to A's keys, metadata differences and
the weights_only prediction of each side. Frozen: a renderer reads them and
never a dict by string key; report.py puts them back into the JSON CONTRACT
has always had.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...tensors.numerics import ValueDiff
from ...tensors.target import TiedKey
from .rollup import Metric, Rollup

if TYPE_CHECKING:
    from ...keys import RuleSet
    from ..loads_check import WeightsOnlyReport


@dataclass(frozen=True)
class Mismatch:
    """One key whose shape (or dtype) differs: ``a`` is what A holds, ``b`` what B expects."""

    key: str
    a: list[int] | str  # a shape, or a dtype name
    b: list[int] | str


@dataclass(frozen=True)
class ValueView:
    """How the ``--values`` figures are presented: order, cut, rollups, histograms (none of it changes ``equal``)."""

    sort: Metric | None = None  # None: A's key order
    top: int | None = None  # keep the first N tensors of ``values`` (after sorting)
    rollup_depth: int | None = None  # group by the first N dotted parts of the key
    rollup_layers: bool = False  # group with every layer index folded (layers.*.attn.q.weight)
    histograms: int = 0  # bin A, B and B-A of the first N tensors in --sort order (the HTML report)

    @property
    def wants_rollups(self) -> bool:
        return self.rollup_depth is not None or self.rollup_layers

    @property
    def needs_norms(self) -> bool:
        """Rollups and the report's heatmap need every tensor's norm, identical ones included."""
        return self.wants_rollups or self.histograms > 0


PLAIN_VIEW = ValueView()


@dataclass(frozen=True, kw_only=True)
class Sides:
    """What was compared: each side's label, format and tensor count, and how B was found."""

    a: str
    b: str
    b_kind: str = "checkpoint"  # or "target"
    a_format: str = ""
    b_format: str = ""
    a_count: int = 0
    b_count: int = 0
    key: str | None = None
    key_b: str | None = None
    target_kwargs: Mapping[str, object] = field(default_factory=dict)
    plain_tensor_attributes: tuple[str, ...] = ()  # a --target's tensors that never reach its state_dict


@dataclass(frozen=True, kw_only=True)
class KeyDiff:
    """What load_state_dict(strict=False) of A into B reports, and the dtypes it would cast."""

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    shape_mismatch: tuple[Mismatch, ...] = ()
    dtype_mismatch: tuple[Mismatch, ...] = ()
    tied: tuple[TiedKey, ...] = ()  # missing keys the --target's shared Parameters fill (still in ``missing``)

    @property
    def differs(self) -> bool:
        return bool(self.missing or self.unexpected or self.shape_mismatch or self.dtype_mismatch)


@dataclass(frozen=True, kw_only=True)
class ValueFigures:
    """The ``--values`` comparison: how it was judged and presented, and what it found."""

    compared_values: bool = False  # --values was given
    atol: float = 1e-8
    rtol: float = 1e-5
    view: ValueView = PLAIN_VIEW
    value_mismatch: tuple[ValueDiff, ...] = ()
    values: tuple[ValueDiff, ...] = ()  # in --sort order, cut to --top
    compared: int = 0  # pairs whose values were compared (``values`` may be cut to --top)
    all_values: tuple[ValueDiff, ...] = ()  # every compared pair, in A's order (the HTML heatmap); not in JSON
    rollups: tuple[Rollup, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RulesApplied:
    """The rewrite of A's keys before comparing: the rules given, then those --auto inferred."""

    steps: tuple[RuleSet, ...] = ()  # applied in turn
    merged: RuleSet | None = None  # the steps as one set (None if they are not one)
    fix: RuleSet | None = None  # with rules given: the one rewrite of A's own keys the fix command states
    renamed: int = 0  # A's keys those rules changed


@dataclass(frozen=True)
class MetadataChange:
    """A metadata path whose value differs: A's and B's values, JSON-safe."""

    path: str
    a: object
    b: object


@dataclass(frozen=True)
class MetadataOnly:
    """A metadata path present on one side only, with its JSON-safe value."""

    path: str
    value: object


@dataclass(frozen=True, kw_only=True)
class MetadataDiff:
    """Differences in the non-tensor entries (epochs, optimizer state, a safetensors ``__metadata__``)."""

    changed: tuple[MetadataChange, ...] = ()
    only_a: tuple[MetadataOnly, ...] = ()
    only_b: tuple[MetadataOnly, ...] = ()

    @property
    def differs(self) -> bool:
        return bool(self.changed or self.only_a or self.only_b)

    def to_json(self) -> dict[str, list[dict[str, object]]]:
        return {"changed": [{"path": c.path, "a": c.a, "b": c.b} for c in self.changed],
                "only_a": [{"path": o.path, "value": o.value} for o in self.only_a],
                "only_b": [{"path": o.path, "value": o.value} for o in self.only_b]}


@dataclass(frozen=True)
class WeightsOnlyPair:
    """torch.load(weights_only=True) of each side (b: None for a --target); never part of ``equal``."""

    a: WeightsOnlyReport | None = None
    b: WeightsOnlyReport | None = None

    def to_json(self) -> dict[str, object]:
        return {"a": self.a.to_json() if self.a is not None else None,
                "b": self.b.to_json() if self.b is not None else None}
