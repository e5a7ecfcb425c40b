"""Diff's steps after reading: rewrite A's keys, compare keys, metadata and values, suggest the fix.

Each step is a function of the plan and the earlier steps' frozen results,
returning its own (``Found``: the report part and the warnings it adds), so
that run_diff (command.py) reads as the list of steps. Keys and metadata come
from metadata alone; only the values step reads tensor bytes.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Generic, TypeVar

from ...model import TensorMeta, shapes_compatible
from ...tensors.target import filled_by_ties, tie_advice
from .parts import KeyDiff, MetadataDiff, Mismatch, RulesApplied, ValueFigures
from .plan import DiffHooks, DiffPlan
from .read import Opened

if TYPE_CHECKING:
    from ...keys import RuleSet, Suggestion
    from ...tensors.numerics import ValueDiff

P = TypeVar("P")


@dataclass(frozen=True)
class Found(Generic[P]):
    """What one step found (a part of the report) and the warnings it adds, in the order they are said."""

    part: P
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rewrite:
    """A's tensors under the keys they are compared with, and the rules that gave them those keys."""

    tensors: tuple[TensorMeta, ...]
    applied: RulesApplied


@dataclass(frozen=True)
class Fix:
    """The suggested rewrite of A's keys, and (with rules given) the one rewrite of A's own keys it states."""

    suggestion: Suggestion | None
    rules: RuleSet | None


def compare_tensors(
    a: Sequence[TensorMeta], b: Sequence[TensorMeta], *, lazy: Iterable[str] = ()
) -> tuple[list[str], list[str], list[Mismatch], list[Mismatch]]:
    """(missing, unexpected, shape_mismatch, dtype_mismatch) for A loaded where B is expected.

    As ``load_state_dict(strict=False)``: missing keys in B's order,
    unexpected keys in A's order, and the size mismatches it raises for
    (a one-element 1-d tensor loads into a 0-d one; lazy parameters take
    any shape). dtypes are compared too, although load_state_dict casts.
    """
    a_map = {t.key: t for t in a}
    b_keys = {t.key for t in b}
    lazy = set(lazy)
    missing = [t.key for t in b if t.key not in a_map]
    unexpected = [t.key for t in a if t.key not in b_keys]
    shape_mismatch: list[Mismatch] = []
    dtype_mismatch: list[Mismatch] = []
    for tb in b:
        ta = a_map.get(tb.key)
        if ta is None or tb.key in lazy:
            continue
        if not shapes_compatible(ta.shape, tb.shape):
            shape_mismatch.append(Mismatch(tb.key, list(ta.shape), list(tb.shape)))
        if ta.dtype != tb.dtype:
            dtype_mismatch.append(Mismatch(tb.key, ta.dtype, tb.dtype))
    return missing, unexpected, shape_mismatch, dtype_mismatch


def rewritten(tensors: Sequence[TensorMeta], rules: RuleSet) -> list[TensorMeta]:
    """``tensors`` under the keys ``rules`` give them (migrate's make_plan: the same conflicts are errors);
    a key a drop rule removes is left out."""
    from ...keys import make_plan

    plan = make_plan(tensors, rules)
    out = []
    for t, entry in zip(tensors, plan.entries, strict=True):
        if entry.output is None:
            continue
        out.append(t if entry.output == t.key else TensorMeta(entry.output, t.dtype, t.shape, t.stride,
                                                              t.storage_offset, t.storage, t.device, t.quantizer))
    return out


def composed(steps: Sequence[RuleSet], keys: Sequence[str]) -> RuleSet | None:
    """``steps`` merged into one RuleSet (``then``) if that gives every key in ``keys`` the key the steps give it
    one after the other; else None (an --add-prefix followed by a --strip-prefix, say, cannot be one set:
    a RuleSet always strips before it adds)."""
    if not steps:
        return None
    merged = steps[0]
    for step in steps[1:]:
        merged = merged.then(step)

    def in_turn(key: str) -> str | None:
        out: str | None = key
        for step in steps:
            if out is None:
                return None
            out = step.new_key(out)
        return out

    return merged if all(merged.new_key(k) == in_turn(k) for k in keys) else None


def _suggest(a: Sequence[TensorMeta], sides: Opened) -> Suggestion | None:
    """The rewrite of ``a``'s keys that best matches B's (keys/infer.py: imported only when needed)."""
    from ...keys import suggest

    return suggest(a, sides.b_tensors, target_prefixes=sides.target_prefixes, lazy=sides.lazy)


def rewrite_keys(plan: DiffPlan, sides: Opened) -> Rewrite:
    """A's keys under the rules given, then under those --auto infers, exactly as ``ckpt migrate`` would."""
    rules = plan.options.rules
    steps: list[RuleSet] = [rules] if rules is not None and not rules.is_empty else []
    original = list(sides.a.tensors)
    tensors = rewritten(original, steps[0]) if steps else original
    if plan.options.auto:
        inferred = _suggest(tensors, sides)
        if inferred is not None and not inferred.rules.is_empty:
            tensors = rewritten(tensors, inferred.rules)
            steps.append(inferred.rules)
    kept = {id(t) for t in original}
    applied = RulesApplied(steps=tuple(steps), merged=composed(steps, sides.a.keys) if steps else None,
                           renamed=sum(id(t) not in kept for t in tensors))
    return Rewrite(tuple(tensors), applied)


def compare_keys(sides: Opened, a: Rewrite) -> Found[KeyDiff]:
    """What load_state_dict would report, the missing keys a target's ties fill, and tensors of another kind."""
    from .subclass import kind_warnings

    missing, unexpected, shape_mm, dtype_mm = compare_tensors(a.tensors, sides.b_tensors, lazy=sides.lazy)
    tied = filled_by_ties(missing, [t.key for t in a.tensors], sides.groups)
    warnings = [tie_advice(tied)] if tied else []
    warnings += kind_warnings(a.tensors, sides.b_tensors)
    return Found(KeyDiff(missing=tuple(missing), unexpected=tuple(unexpected), shape_mismatch=tuple(shape_mm),
                         dtype_mismatch=tuple(dtype_mm), tied=tuple(tied)), tuple(warnings))


def compare_metadata(sides: Opened) -> Found[MetadataDiff]:
    """The non-tensor entries of two checkpoints (a target has none); values left unread are not compared."""
    from .metadata import content_metadata, mask_unread, metadata_diff

    if sides.b is None:
        return Found(MetadataDiff())
    meta_a, meta_b, unread = mask_unread(content_metadata(sides.a), content_metadata(sides.b))
    found = metadata_diff(meta_a, meta_b)
    if not unread:
        return Found(found)
    return Found(found, (f"{unread} non-tensor entr{'y was' if unread == 1 else 'ies were'} not read (DCP bytes "
                         "items), so their values were not compared; --values reads and compares them",))


def compare_figures(plan: DiffPlan, sides: Opened, a: Rewrite, keys: KeyDiff, hooks: DiffHooks) -> Found[ValueFigures]:
    """With --values: every pair of equal shape compared, one pair at a time, ordered, cut and rolled up."""
    from .rollup import ordered, rollups

    options = plan.options
    view = options.view
    found = ValueFigures(compared_values=options.values, atol=options.atol, rtol=options.rtol, view=view)
    if not options.values or sides.b is None:
        return Found(found)
    diffs, skipped = _value_diffs(plan, sides.b.by_key, a, keys, hooks)
    groups = (ordered(rollups(diffs, depth=view.rollup_depth, fold=view.rollup_layers), view.sort, None)
              if view.wants_rollups else [])
    found = replace(found, value_mismatch=tuple(v for v in diffs if not v.passed),
                    values=tuple(ordered(diffs, view.sort, view.top)), compared=len(diffs), all_values=tuple(diffs),
                    rollups=tuple(groups))
    if not skipped:
        return Found(found)
    return Found(found, (f"{len(skipped)} tensor(s) hold no data and were not compared: " + ", ".join(skipped[:5]),))


def _value_diffs(plan: DiffPlan, b_map: dict[str, TensorMeta], a: Rewrite, keys: KeyDiff,
                 hooks: DiffHooks) -> tuple[list[ValueDiff], list[str]]:
    """The pairs of equal shape (a wrapper subclass's by its inner tensors) compared, and those holding no data."""
    from ...tensors.numerics import compare_values
    from .rollup import Metric, sort_key
    from .subclass import inner_value_pairs

    bad_shape = {m.key for m in keys.shape_mismatch}
    pairs = inner_value_pairs([(t, b_map[t.key]) for t in a.tensors if t.key in b_map and t.key not in bad_shape])
    view = plan.options.view
    rank = sort_key(view.sort or Metric.REL_L2)
    return compare_values(pairs, atol=plan.options.atol, rtol=plan.options.rtol, progress=hooks.progress,
                          norms=view.needs_norms, histograms=view.histograms, rank=lambda v: -_first(rank(v)))


def _first(key: object) -> float:
    """The number in a sort key (``(-rel_l2, key)``): smaller sorts first, so it is negated to rank."""
    head = key[0] if isinstance(key, tuple) else 0.0
    return float(head) if isinstance(head, (int, float)) else 0.0


def suggest_fix(sides: Opened, a: Rewrite, keys: KeyDiff) -> Fix:
    """The rewrite that reconciles the keys still apart, and with rules given the one set the fix command states."""
    suggestion = _suggest(a.tensors, sides) if keys.missing or keys.unexpected or keys.shape_mismatch else None
    steps = a.applied.steps
    if not steps:
        return Fix(suggestion, None)
    whole = [*steps, suggestion.rules] if suggestion is not None else list(steps)
    fix_rules = composed(whole, sides.a.keys)
    if fix_rules is None:  # the steps do not merge into one migrate rule set: infer it from A's own keys
        direct = _suggest(sides.a.tensors, sides)
        fix_rules = direct.rules if direct is not None else None
    return Fix(suggestion, fix_rules)
