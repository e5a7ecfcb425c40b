"""``ckpt diff``: what happens when A's weights are loaded where B is expected.

Key, shape and dtype differences follow ``load_state_dict`` and come from
metadata alone; when both sides are checkpoints nothing here imports torch.
``values=True`` streams tensor pairs one at a time (tensors/values.py) and is
the only path that reads tensor bytes; metadata is compared in
metadata.py and reported in report.py. A ``--target`` is a module
built on the meta device (tensors/target.py), which of course imports torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ...errors import UsageError
from ...formats.options import SourceOptions
from ...io.remote.counts import counts_remote
from ...limits import DEFAULT_LIMITS, Limits
from ...model import Checkpoint, TensorMeta, shapes_compatible
from ...progress import NO_PROGRESS, Progress
from ...tensors.closeness import ValueDiff
from ...tensors.ties import filled_by_ties, tie_advice, tied_groups
from ...tensors.values import compare_values
from .metadata import content_metadata, mask_unread, metadata_diff
from .report import PLAIN_VIEW, DiffReport, Mismatch, ValueView
from .rollup import Metric, ordered, rollups, sort_key
from .subclass import inner_value_pairs, kind_warnings

if TYPE_CHECKING:
    from ...keys.rules import RuleSet

if TYPE_CHECKING:  # a path, or from Python a state dict or an nn.Module; a target: a SPEC, class or instance
    from ...tensors.target import TargetSpec
    from ..inputs import CheckpointInput


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
        if ta is None:
            continue
        if tb.key not in lazy and not shapes_compatible(ta.shape, tb.shape):
            shape_mismatch.append(Mismatch(tb.key, list(ta.shape), list(tb.shape)))
        if ta.dtype != tb.dtype and tb.key not in lazy:
            dtype_mismatch.append(Mismatch(tb.key, ta.dtype, tb.dtype))
    return missing, unexpected, shape_mismatch, dtype_mismatch


def rewritten(tensors: Sequence[TensorMeta], rules: RuleSet) -> list[TensorMeta]:
    """``tensors`` under the keys ``rules`` give them (migrate's make_plan: the same conflicts are errors);
    a key a drop rule removes is left out."""
    from ...keys.rules import make_plan

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


def _first(key: Any) -> float:
    """The number in a sort key (``(-rel_l2, key)``): smaller sorts first, so it is negated to rank."""
    head = key[0] if isinstance(key, tuple) else 0.0
    return float(head) if isinstance(head, (int, float)) else 0.0


# ------------------------------------------------------------------ the command


@counts_remote("a", "b")
def diff(
    a: CheckpointInput,
    b: CheckpointInput | None = None,
    *,
    target: TargetSpec | None = None,
    target_kwargs: dict[str, Any] | None = None,
    key: str | None = None,
    key_b: str | None = None,
    unsafe: bool = False,
    values: bool = False,
    atol: float = 1e-8,
    rtol: float = 1e-5,
    progress: Progress = NO_PROGRESS,
    fail_on_metadata: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    torch_version: str | None = None,
    rules: RuleSet | None = None,
    auto: bool = False,
    view: ValueView = PLAIN_VIEW,
    tp_rules: str | None = None,
) -> DiffReport:
    """Compare checkpoint ``a`` with checkpoint ``b`` or with a ``target`` module spec.

    ``key`` selects A's state_dict (and B's, unless ``key_b`` is given).
    ``values`` compares the data of every common key of equal shape,
    reading one tensor pair at a time, and reports the pairs done to
    ``progress`` ("comparing values").
    ``torch_version``: whose weights_only rules predict torch.load of each side.
    ``rules`` (strip/add prefix, rename: migrate's RuleSet) rewrite A's keys
    before anything is compared, exactly as ``ckpt migrate`` would; ``auto``
    then infers and applies the rewrite that makes A's keys match B's.
    ``view``: the order, cut, rollups and histograms of the ``--values`` figures.
    ``tp_rules`` names a TOML file saying how tensor-parallel shards merge (a Megatron-LM ``mp_rank_XX``
    folder, a DeepSpeed run without universal_checkpoint_info), on either side, as ``ckpt migrate`` reads it.
    """
    from ..inputs import label_of, open_input
    from ..weights_only.verdict import assess

    if (b is None) == (target is None):
        raise UsageError("give either a second checkpoint B or --target SPEC (exactly one)")
    if values and target is not None:
        raise UsageError("--values compares two checkpoints; a --target module built on the meta device "
                         "holds no values")
    if key_b is not None and target is not None:
        raise UsageError("--key-b selects inside a second checkpoint B; a --target module has no container")
    if (view.sort is not None or view.top is not None or view.rollup_depth is not None or view.rollup_layers
            or view.histograms) and not values:
        raise UsageError("--sort, --top, --rollup-depth, --rollup-layers and --html order or summarise the "
                         "--values figures: add --values")
    if atol < 0 or rtol < 0 or math.isnan(atol) or math.isnan(rtol):
        raise UsageError("--atol and --rtol must be non-negative numbers")
    from ...formats.deepspeed import load_rules

    rules_tp = load_rules(tp_rules) if tp_rules else None  # before either side is read: a bad file is exit 2
    source = SourceOptions(key=key, unsafe=unsafe, limits=limits, tp_rules=rules_tp)
    ckpt_a = open_input(a, source, read_values=values)  # --values: DCP bytes items
    a = label_of(a, ckpt_a)
    warnings = [f"A: {w}" for w in ckpt_a.warnings]
    lazy: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()
    groups: list[tuple[str, ...]] = []
    ckpt_b: Checkpoint | None = None
    if target is not None:
        from ...tensors.target import build_target

        built = build_target(target, target_kwargs)
        b_label, b_tensors, b_format = built.spec, list(built.tensors), f"nn.Module built on {built.device}"
        lazy, plain = built.lazy, built.plain_tensor_attributes
        warnings += list(built.warnings)  # each already says "target ..."
        target_prefixes = built.attribute_prefixes
        groups = tied_groups(built.module)
    else:
        ckpt_b = open_input(cast("CheckpointInput", b), source.with_key(key_b if key_b is not None else key),
                            read_values=values)  # b is not None
        b_label = label_of(cast("CheckpointInput", b), ckpt_b)
        b_tensors, b_format = list(ckpt_b.tensors), ckpt_b.format
        warnings += [f"B: {w}" for w in ckpt_b.warnings]
        target_prefixes = []
    try:
        steps: list[RuleSet] = [rules] if rules is not None and not rules.is_empty else []
        a_tensors = list(ckpt_a.tensors)
        original = {id(t) for t in a_tensors}
        if steps:
            a_tensors = rewritten(a_tensors, steps[0])
        if auto:
            from ...keys.infer import suggest

            inferred = suggest(a_tensors, b_tensors, target_prefixes=target_prefixes, lazy=lazy)
            if inferred is not None and not inferred.rules.is_empty:
                a_tensors = rewritten(a_tensors, inferred.rules)
                steps.append(inferred.rules)
        missing, unexpected, shape_mm, dtype_mm = compare_tensors(a_tensors, b_tensors, lazy=lazy)
        tied = filled_by_ties(missing, [t.key for t in a_tensors], groups)
        if tied:
            warnings.append(tie_advice(tied))
        suggestion = None
        if missing or unexpected or shape_mm:
            from ...keys.infer import suggest  # rules and scoring: only when the keys do not line up

            suggestion = suggest(a_tensors, b_tensors, target_prefixes=target_prefixes, lazy=lazy)
        fix_rules = None  # the one rewrite of A's own keys that the fix command states
        if steps:
            whole = steps + ([suggestion.rules] if suggestion is not None else [])
            fix_rules = composed(whole, ckpt_a.keys)
            if fix_rules is None:  # the steps do not merge into one migrate rule set: infer it from A's own keys
                from ...keys.infer import suggest

                direct = suggest(ckpt_a.tensors, b_tensors, target_prefixes=target_prefixes, lazy=lazy)
                fix_rules = direct.rules if direct is not None else None
        warnings.extend(kind_warnings(a_tensors, b_tensors))
        meta: dict[str, Any] = {"changed": [], "only_a": [], "only_b": []}
        if ckpt_b is not None:
            meta_a, meta_b, unread = mask_unread(content_metadata(ckpt_a), content_metadata(ckpt_b))
            meta = metadata_diff(meta_a, meta_b)
            if unread:
                warnings.append(f"{unread} non-tensor entr{'y was' if unread == 1 else 'ies were'} not read (DCP "
                                "bytes items), so their values were not compared; --values reads and compares them")
        value_diffs: list[ValueDiff] = []
        if values and ckpt_b is not None:
            bad_shape = {m.key for m in shape_mm}
            b_map = ckpt_b.by_key
            pairs = inner_value_pairs([(t, b_map[t.key]) for t in a_tensors if t.key in b_map
                                       and t.key not in bad_shape])
            rank = sort_key(view.sort or Metric.REL_L2)
            value_diffs, skipped = compare_values(
                pairs, atol=atol, rtol=rtol, progress=progress, norms=view.needs_norms,
                histograms=view.histograms, rank=lambda v: -_first(rank(v)))
            if skipped:
                warnings.append(f"{len(skipped)} tensor(s) hold no data and were not compared: "
                                + ", ".join(skipped[:5]))
    finally:
        ckpt_a.close()
        if ckpt_b is not None:
            ckpt_b.close()
    return DiffReport(
        a=a, b=b_label, missing=tuple(missing), unexpected=tuple(unexpected),
        shape_mismatch=tuple(shape_mm), dtype_mismatch=tuple(dtype_mm),
        value_mismatch=tuple(v for v in value_diffs if not v.passed),
        values=tuple(ordered(value_diffs, view.sort, view.top)), compared=len(value_diffs),
        all_values=tuple(value_diffs),
        rollups=tuple(ordered(rollups(value_diffs, depth=view.rollup_depth, fold=view.rollup_layers),
                              view.sort, None)) if view.wants_rollups else (),
        view=view, rules=composed(steps, ckpt_a.keys) if steps else None, rule_steps=tuple(steps),
        fix_rules=fix_rules, renamed=sum(id(t) not in original for t in a_tensors),
        metadata_diff=meta, suggestion=suggestion, warnings=tuple(warnings),
        b_kind="target" if target is not None else "checkpoint", a_format=ckpt_a.format, b_format=b_format,
        a_count=len(ckpt_a.tensors), b_count=len(b_tensors), compared_values=bool(values),
        atol=atol, rtol=rtol, fail_on_metadata=fail_on_metadata, key=key, key_b=key_b,
        target_kwargs=dict(target_kwargs or {}), plain_tensor_attributes=plain, tied=tuple(tied),
        weights_only_a=assess(ckpt_a, torch_version),
        weights_only_b=assess(ckpt_b, torch_version) if ckpt_b is not None else None,
    )
