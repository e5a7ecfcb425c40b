"""What ``ckpt diff`` reports: one typed part per question (parts.py), the verdict, the fix command and the JSON.

Frozen values that the steps (steps.py) fill in and the renderers
(render/diff.py, render/html/) read; nothing here reads a checkpoint.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...io.remote import with_remote
from ...tensors.numerics import ValueDiff
from ...tensors.target import TiedKey
from .parts import (
    PLAIN_VIEW,
    KeyDiff,
    MetadataDiff,
    Mismatch,
    RulesApplied,
    Sides,
    ValueFigures,
    ValueView,
    WeightsOnlyPair,
)
from .rollup import AGGREGATION, Rollup

if TYPE_CHECKING:
    from ...keys import RuleSet, Suggestion
    from ..loads_check import WeightsOnlyReport


@dataclass(frozen=True, kw_only=True)
class DiffReport:
    """Everything ``ckpt diff`` found, in one typed part per question; ``equal`` decides the exit code.

    The flat names below each part (``missing``, ``values``, ``rule_steps``, ...) read the parts: callers of
    the Python API have used them since diff had one, and the JSON keeps them.
    """

    sides: Sides
    keys: KeyDiff
    figures: ValueFigures
    rewrite: RulesApplied
    metadata: MetadataDiff
    suggestion: Suggestion | None
    weights_only: WeightsOnlyPair
    warnings: tuple[str, ...]
    fail_on_metadata: bool = False
    remote: dict[str, int] | None = None  # requests and bytes, when a path was a URL

    @property
    def metadata_differs(self) -> bool:
        return self.metadata.differs

    @property
    def equal(self) -> bool:
        """No difference that affects loading: keys, shapes, dtypes and (when compared) values.

        Metadata differences (epoch, optimizer, ...) count only with
        ``fail_on_metadata``: they never change what load_state_dict does.
        """
        differs = self.keys.differs or bool(self.figures.value_mismatch)
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
            from ...keys import Suggestion

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
        """The JSON CONTRACT fixes: flat keys in this order, whichever part holds them."""
        sides, keys, figures = self.sides, self.keys, self.figures
        return with_remote({
            "equal": self.equal,
            "a": sides.a,
            "b": sides.b,
            "b_kind": sides.b_kind,
            "a_format": sides.a_format,
            "b_format": sides.b_format,
            "a_tensors": sides.a_count,
            "b_tensors": sides.b_count,
            "missing": list(keys.missing),
            "unexpected": list(keys.unexpected),
            "shape_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in keys.shape_mismatch],
            "dtype_mismatch": [{"key": m.key, "a": m.a, "b": m.b} for m in keys.dtype_mismatch],
            **self._values_json(),
            "rules_applied": self._rules_json(),
            "atol": figures.atol,
            "rtol": figures.rtol,
            "metadata_diff": self.metadata.to_json(),
            "suggestion": self._suggestion_json(),
            "plain_tensor_attributes": list(sides.plain_tensor_attributes),
            "tied": [t.to_json() for t in keys.tied],
            "warnings": list(self.warnings),
            "weights_only": self.weights_only.to_json(),
        }, self.remote)

    def _values_json(self) -> dict[str, Any]:
        f, view = self.figures, self.figures.view
        return {
            "value_mismatch": [v.to_json() for v in f.value_mismatch],
            "values_compared": f.compared_values,
            "values": [v.to_json() for v in f.values] if f.compared_values else None,
            "values_total": f.compared if f.compared_values else None,
            "sort": view.sort.value if view.sort is not None else None,
            "top": view.top,
            "rollups": ({"depth": view.rollup_depth, "layers_folded": view.rollup_layers,
                         "aggregation": dict(AGGREGATION), "groups": [g.to_json() for g in f.rollups]}
                        if view.wants_rollups else None),
        }

    def _rules_json(self) -> dict[str, Any] | None:
        steps = self.rewrite.steps
        if not steps:
            return None
        return {"options": [a for step in steps for a in step.cli_args()],
                "steps": [step.cli_args() for step in steps], "renamed": self.rewrite.renamed,
                "command": self.migrate_command()}

    def _suggestion_json(self) -> dict[str, Any] | None:
        if self.suggestion is None:
            return None
        out = self.suggestion.to_json()
        out["command"] = self.migrate_command()
        out["dropped_keys"] = self.dropped_by_fix()
        return out

    # ---------------------------------------------- the flat names of the Python API, read from the parts
    @property
    def a(self) -> str:
        return self.sides.a

    @property
    def b(self) -> str:
        return self.sides.b

    @property
    def b_kind(self) -> str:
        return self.sides.b_kind

    @property
    def a_format(self) -> str:
        return self.sides.a_format

    @property
    def b_format(self) -> str:
        return self.sides.b_format

    @property
    def a_count(self) -> int:
        return self.sides.a_count

    @property
    def b_count(self) -> int:
        return self.sides.b_count

    @property
    def key(self) -> str | None:
        return self.sides.key

    @property
    def key_b(self) -> str | None:
        return self.sides.key_b

    @property
    def target_kwargs(self) -> Mapping[str, object]:
        return self.sides.target_kwargs

    @property
    def plain_tensor_attributes(self) -> tuple[str, ...]:
        return self.sides.plain_tensor_attributes

    @property
    def missing(self) -> tuple[str, ...]:
        return self.keys.missing

    @property
    def unexpected(self) -> tuple[str, ...]:
        return self.keys.unexpected

    @property
    def shape_mismatch(self) -> tuple[Mismatch, ...]:
        return self.keys.shape_mismatch

    @property
    def dtype_mismatch(self) -> tuple[Mismatch, ...]:
        return self.keys.dtype_mismatch

    @property
    def tied(self) -> tuple[TiedKey, ...]:
        return self.keys.tied

    @property
    def compared_values(self) -> bool:
        return self.figures.compared_values

    @property
    def atol(self) -> float:
        return self.figures.atol

    @property
    def rtol(self) -> float:
        return self.figures.rtol

    @property
    def view(self) -> ValueView:
        return self.figures.view

    @property
    def value_mismatch(self) -> tuple[ValueDiff, ...]:
        return self.figures.value_mismatch

    @property
    def values(self) -> tuple[ValueDiff, ...]:
        return self.figures.values

    @property
    def compared(self) -> int:
        return self.figures.compared

    @property
    def all_values(self) -> tuple[ValueDiff, ...]:
        return self.figures.all_values

    @property
    def rollups(self) -> tuple[Rollup, ...]:
        return self.figures.rollups

    @property
    def rule_steps(self) -> tuple[RuleSet, ...]:
        return self.rewrite.steps

    @property
    def rules(self) -> RuleSet | None:
        return self.rewrite.merged

    @property
    def fix_rules(self) -> RuleSet | None:
        return self.rewrite.fix

    @property
    def renamed(self) -> int:
        return self.rewrite.renamed

    @property
    def metadata_diff(self) -> dict[str, list[dict[str, object]]]:
        return self.metadata.to_json()

    @property
    def weights_only_a(self) -> WeightsOnlyReport | None:
        return self.weights_only.a

    @property
    def weights_only_b(self) -> WeightsOnlyReport | None:
        return self.weights_only.b


__all__ = ["PLAIN_VIEW", "DiffReport", "Mismatch", "ValueView"]
