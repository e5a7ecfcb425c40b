"""What ``ckpt diff`` reports: key, shape and dtype mismatches, value differences, the verdict.

Frozen dataclasses that the comparisons (diff.py, tensors/closeness.py) fill in and
the renderers (render/diff.py) read; nothing here reads a checkpoint.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...io.remote.counts import with_remote
from ...tensors.numerics import ValueDiff
from ...tensors.target import TiedKey
from .rollup import AGGREGATION, Metric, Rollup

if TYPE_CHECKING:
    from ...keys.infer import Suggestion
    from ...keys.rules import RuleSet
    from ..loads_check.verdict import WeightsOnlyReport


@dataclass(frozen=True)
class Mismatch:
    """One key whose shape (or dtype) differs: ``a`` is what A holds, ``b`` what B expects."""

    key: str
    a: Any  # shape list or dtype string
    b: Any


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


@dataclass(frozen=True)
class DiffReport:
    """Everything ``ckpt diff`` found; ``equal`` decides the exit code."""

    a: str
    b: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    shape_mismatch: tuple[Mismatch, ...]
    dtype_mismatch: tuple[Mismatch, ...]
    value_mismatch: tuple[ValueDiff, ...]
    values: tuple[ValueDiff, ...]
    metadata_diff: dict[str, Any]
    suggestion: Suggestion | None
    warnings: tuple[str, ...]
    b_kind: str = "checkpoint"  # or "target"
    a_format: str = ""
    b_format: str = ""
    a_count: int = 0
    b_count: int = 0
    compared_values: bool = False
    atol: float = 1e-8
    rtol: float = 1e-5
    fail_on_metadata: bool = False
    key: str | None = None
    key_b: str | None = None
    target_kwargs: Mapping[str, Any] = field(default_factory=dict)
    plain_tensor_attributes: tuple[str, ...] = ()
    tied: tuple[TiedKey, ...] = ()  # missing keys the --target's shared Parameters fill (still in ``missing``)
    # torch.load(weights_only=True) of each side (b: None for a --target); never part of ``equal``
    weights_only_a: WeightsOnlyReport | None = None
    weights_only_b: WeightsOnlyReport | None = None
    remote: dict[str, int] | None = None  # requests and bytes, when a path was a URL
    compared: int = 0  # pairs whose values were compared (``values`` may be cut to --top)
    all_values: tuple[ValueDiff, ...] = ()  # every compared pair, in A's order (the HTML heatmap); not in JSON
    rollups: tuple[Rollup, ...] = ()
    view: ValueView = PLAIN_VIEW
    rules: RuleSet | None = None  # applied to A's keys before comparing, as one set (None if they are not one)
    rule_steps: tuple[RuleSet, ...] = ()  # the rules given, then those --auto inferred, applied in turn
    fix_rules: RuleSet | None = None  # with rules given: the one rewrite of A's own keys the fix command states
    renamed: int = 0  # A's keys those rules changed

    @property
    def metadata_differs(self) -> bool:
        return any(self.metadata_diff.get(k) for k in ("changed", "only_a", "only_b"))

    @property
    def equal(self) -> bool:
        """No difference that affects loading: keys, shapes, dtypes and (when compared) values.

        Metadata differences (epoch, optimizer, ...) count only with
        ``fail_on_metadata``: they never change what load_state_dict does.
        """
        differs = self.missing or self.unexpected or self.shape_mismatch or self.dtype_mismatch or self.value_mismatch
        return not differs and not (self.fail_on_metadata and self.metadata_differs)

    def migrate_command(self, output: str | None = None) -> str | None:
        """The ``ckpt migrate`` command that applies the rules given to diff and the suggestion to A, or None."""
        from dataclasses import replace

        if not self.rule_steps:
            if self.suggestion is None:
                return None
            whole = self.suggestion
        elif self.fix_rules is None or (self.suggestion is None and not self.renamed):
            return None
        elif self.suggestion is None:
            from ...keys.infer import Suggestion

            whole = Suggestion(self.fix_rules, 0, len(self.missing), len(self.unexpected), len(self.shape_mismatch))
        else:
            whole = replace(self.suggestion, rules=self.fix_rules)
        target = kwargs = None
        # --target makes migrate verify a strict load: only for a rewrite that leaves no key difference
        if self.b_kind == "target" and whole.complete:
            import json

            target = self.b
            kwargs = json.dumps(dict(self.target_kwargs)) if self.target_kwargs else None
        # an in-memory A (the Python API) has no path to give migrate: the command names the file to save it to
        a = "a.pth" if self.a_in_memory else self.a
        return whole.command(a, output, key=self.key, target=target, target_kwargs=kwargs)

    @property
    def a_in_memory(self) -> bool:
        """A was a state dict or module given from Python: the fix command needs it saved first."""
        from ...format_names import Format

        return self.a_format == Format.IN_MEMORY.value

    def dropped_by_fix(self) -> list[str]:
        """A's keys that the suggested rewrite leaves out (``--drop``: a head the other side lacks)."""
        s = self.suggestion
        if s is None or not s.rules.drop:
            return []
        return [k for k in self.unexpected if s.rules.new_key(k) is None]

    def rules_text(self) -> str:
        """The rules applied to A's keys, in the order they were applied."""
        return " then ".join(step.describe() for step in self.rule_steps)

    def to_json(self) -> dict[str, Any]:
        suggestion = None
        if self.suggestion is not None:
            suggestion = self.suggestion.to_json()
            suggestion["command"] = self.migrate_command()
            suggestion["dropped_keys"] = self.dropped_by_fix()
        return with_remote({
            "equal": self.equal,
            "a": self.a,
            "b": self.b,
            "b_kind": self.b_kind,
            "a_format": self.a_format,
            "b_format": self.b_format,
            "a_tensors": self.a_count,
            "b_tensors": self.b_count,
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "shape_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in self.shape_mismatch],
            "dtype_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in self.dtype_mismatch],
            "value_mismatch": [v.to_json() for v in self.value_mismatch],
            "values_compared": self.compared_values,
            "values": [v.to_json() for v in self.values] if self.compared_values else None,
            "values_total": self.compared if self.compared_values else None,
            "sort": self.view.sort.value if self.view.sort is not None else None,
            "top": self.view.top,
            "rollups": ({"depth": self.view.rollup_depth, "layers_folded": self.view.rollup_layers,
                         "aggregation": dict(AGGREGATION), "groups": [g.to_json() for g in self.rollups]}
                        if self.view.wants_rollups else None),
            "rules_applied": ({"options": [a for step in self.rule_steps for a in step.cli_args()],
                               "steps": [step.cli_args() for step in self.rule_steps], "renamed": self.renamed,
                               "command": self.migrate_command()} if self.rule_steps else None),
            "atol": self.atol,
            "rtol": self.rtol,
            "metadata_diff": self.metadata_diff,
            "suggestion": suggestion,
            "plain_tensor_attributes": list(self.plain_tensor_attributes),
            "tied": [t.to_json() for t in self.tied],
            "warnings": list(self.warnings),
            "weights_only": {
                "a": self.weights_only_a.to_json() if self.weights_only_a is not None else None,
                "b": self.weights_only_b.to_json() if self.weights_only_b is not None else None,
            },
        }, self.remote)
