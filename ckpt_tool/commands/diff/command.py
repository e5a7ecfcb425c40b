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
from ...io.remote.counts import counts_remote
from ...limits import DEFAULT_LIMITS, Limits
from ...model import Checkpoint, TensorMeta, shapes_compatible
from ...progress import NO_PROGRESS, Progress
from ...tensors.closeness import ValueDiff
from ...tensors.ties import filled_by_ties, tie_advice, tied_groups
from ...tensors.values import compare_values
from .metadata import content_metadata, mask_unread, metadata_diff
from .report import DiffReport, Mismatch

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
) -> DiffReport:
    """Compare checkpoint ``a`` with checkpoint ``b`` or with a ``target`` module spec.

    ``key`` selects A's state_dict (and B's, unless ``key_b`` is given).
    ``values`` compares the data of every common key of equal shape,
    reading one tensor pair at a time, and reports the pairs done to
    ``progress`` ("comparing values").
    ``torch_version``: whose weights_only rules predict torch.load of each side.
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
    if atol < 0 or rtol < 0 or math.isnan(atol) or math.isnan(rtol):
        raise UsageError("--atol and --rtol must be non-negative numbers")
    ckpt_a = open_input(a, key=key, unsafe=unsafe, limits=limits, read_values=values)  # --values: DCP bytes items
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
        ckpt_b = open_input(cast("CheckpointInput", b), key=key_b if key_b is not None else key,  # not None
                            unsafe=unsafe, limits=limits, read_values=values)
        b_label = label_of(cast("CheckpointInput", b), ckpt_b)
        b_tensors, b_format = list(ckpt_b.tensors), ckpt_b.format
        warnings += [f"B: {w}" for w in ckpt_b.warnings]
        target_prefixes = []
    try:
        missing, unexpected, shape_mm, dtype_mm = compare_tensors(ckpt_a.tensors, b_tensors, lazy=lazy)
        tied = filled_by_ties(missing, ckpt_a.keys, groups)
        if tied:
            warnings.append(tie_advice(tied))
        suggestion = None
        if missing or unexpected or shape_mm:
            from ...keys.infer import suggest  # rules and scoring: only when the keys do not line up

            suggestion = suggest(ckpt_a.tensors, b_tensors, target_prefixes=target_prefixes, lazy=lazy)
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
            pairs = [(t, b_map[t.key]) for t in ckpt_a.tensors if t.key in b_map and t.key not in bad_shape]
            value_diffs, skipped = compare_values(pairs, atol=atol, rtol=rtol, progress=progress)
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
        value_mismatch=tuple(v for v in value_diffs if not v.passed), values=tuple(value_diffs),
        metadata_diff=meta, suggestion=suggestion, warnings=tuple(warnings),
        b_kind="target" if target is not None else "checkpoint", a_format=ckpt_a.format, b_format=b_format,
        a_count=len(ckpt_a.tensors), b_count=len(b_tensors), compared_values=bool(values),
        atol=atol, rtol=rtol, fail_on_metadata=fail_on_metadata, key=key, key_b=key_b,
        target_kwargs=dict(target_kwargs or {}), plain_tensor_attributes=plain, tied=tuple(tied),
        weights_only_a=assess(ckpt_a, torch_version),
        weights_only_b=assess(ckpt_b, torch_version) if ckpt_b is not None else None,
    )
