"""Text rendering of a DiffReport: folded keys, torch's own wording, and the fix."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..commands.diff import DiffReport, KeyDiff, MetadataDiff, Mismatch, Sides, ValueFigures, WeightsOnlyPair
from ..tensors.numerics import ValueDiff
from .common import fold_labeled, shape_str, simple_table, write_report

# Folded lines shown per section; --json always lists every key.
MAX_LINES = 40


def _section(title: str, rows: list[str], total: int) -> list[str]:
    out = [f"{title}: {total}"]
    shown = rows[:MAX_LINES]
    out.extend(f"  {r}" for r in shown)
    if len(rows) > len(shown):
        out.append(f"  ... {len(rows) - len(shown)} more lines (--json lists every key)")
    return out


def _folded(items: Sequence[tuple[str, Any]], fmt: Any) -> list[str]:
    rows = []
    for text, label, count in fold_labeled(items):
        suffix = f"  ({count} keys)" if count > 1 else ""
        shown = fmt(label)
        rows.append(f"{text}  {shown}{suffix}" if shown else f"{text}{suffix}")
    return rows


def _fmt_float(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


VALUE_COLUMNS = ["key", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine", "outside tol", "nan a/b", "inf a/b",
                 "compared as", "result"]


def value_row(v: ValueDiff) -> list[str]:
    return [v.key, _fmt_float(v.max_abs), _fmt_float(v.max_rel), _fmt_float(v.mean_abs), _fmt_float(v.rel_l2),
            _fmt_cos(v.cosine), f"{v.mismatched:,}/{v.numel:,}", f"{v.nan_a}/{v.nan_b}", f"{v.inf_a}/{v.inf_b}",
            v.compared_as, "ok" if v.passed else "FAIL"]


def cosine_text(x: float) -> str:
    """A cosine as people compare them: ``1`` when equal, ``1-3.1e-08`` near 1 (never a rounded 1.000000)."""
    if not math.isfinite(x):
        return str(x)
    if x == 1.0:
        return "1"
    if abs(1.0 - x) < 1e-5:
        return f"1{'-' if x < 1 else '+'}{abs(1.0 - x):.2g}"
    return f"{x:.6f}"


def _fmt_cos(x: float) -> str:
    """Cosines near 1 are what people compare: ``1-3.1e-08`` rather than a rounded ``1.000000``."""
    return cosine_text(x)


def _value_table(diffs: Sequence[ValueDiff]) -> str:
    rows = [value_row(v) for v in diffs]
    # simple_table: tabulate's text without its import and per-row cost (a value table can have 200,000 rows)
    return simple_table(rows, VALUE_COLUMNS)


def _rollup_lines(f: ValueFigures) -> list[str]:
    view = f.view
    if not view.wants_rollups:
        return []
    how = []
    if view.rollup_layers:
        how.append("layer indices folded")
    if view.rollup_depth is not None:
        how.append(f"keys cut to {view.rollup_depth} part(s)")
    rows = [[g.name, f"{g.tensors:,}", f"{g.numel:,}", _fmt_float(g.max_abs), _fmt_float(g.mean_abs),
             _fmt_float(g.rel_l2), _fmt_cos(g.cosine), f"{g.mismatched_share:.2%}"] for g in f.rollups]
    out = ["", f"rollup ({', '.join(how)}): {len(f.rollups)} group(s); mean_abs and outside tol element-weighted, "
               "rel_l2 and cosine of each group as one vector"]
    table = simple_table(rows[:MAX_LINES], ["group", "tensors", "numel", "max_abs", "mean_abs", "rel_l2", "cosine",
                                            "outside tol"])
    out.extend("  " + line for line in table.splitlines())
    if len(rows) > MAX_LINES:
        out.append(f"  ... {len(rows) - MAX_LINES} more groups (--json lists every group)")
    return out


def csv_text(report: DiffReport) -> str:
    """The per-tensor table (every figure, full precision) as CSV, in --sort order and cut to --top."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["key", "numel", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine", "mismatched",
                "mismatched_share", "nan_a", "nan_b", "inf_a", "inf_b", "compared_as", "passed"])
    for v in report.figures.values:
        w.writerow([v.key, v.numel, repr(v.max_abs), repr(v.max_rel), repr(v.mean_abs), repr(v.rel_l2),
                    repr(v.cosine), v.mismatched, repr(v.mismatched_share), v.nan_a, v.nan_b, v.inf_a, v.inf_b,
                    v.compared_as, "true" if v.passed else "false"])
    return buf.getvalue()


def write_csv(report: DiffReport, path: str) -> None:
    """Write csv_text atomically (a temporary beside ``path``, fsync, rename)."""
    write_report(csv_text(report).encode("utf-8"), path, "CSV table")


def _torch_message(keys: KeyDiff) -> list[str]:
    """What load_state_dict(strict=True) would raise, in its own words (the text people search for)."""
    parts = []
    if keys.missing:
        shown = ", ".join(f'"{k}"' for k in keys.missing[:6]) + (", ..." if len(keys.missing) > 6 else "")
        parts.append(f"Missing key(s) in state_dict: {shown}.")
    if keys.unexpected:
        shown = ", ".join(f'"{k}"' for k in keys.unexpected[:6]) + (", ..." if len(keys.unexpected) > 6 else "")
        parts.append(f"Unexpected key(s) in state_dict: {shown}.")
    for m in keys.shape_mismatch[:3]:
        parts.append(f"size mismatch for {m.key}: copying a param with shape torch.Size({m.a}) from checkpoint, "
                     f"the shape in current model is torch.Size({m.b}).")
    if len(keys.shape_mismatch) > 3:
        parts.append(f"... and {len(keys.shape_mismatch) - 3} more size mismatches.")
    return parts


def _metadata_lines(meta: MetadataDiff) -> list[str]:
    rows = [f"changed    {c.path}: {_short(c.a)} -> {_short(c.b)}" for c in meta.changed]
    rows += [f"only in A  {o.path}: {_short(o.value)}" for o in meta.only_a]
    rows += [f"only in B  {o.path}: {_short(o.value)}" for o in meta.only_b]
    return rows


def _short(value: object, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _value_rows(f: ValueFigures) -> tuple[list[ValueDiff], bool]:
    """The tensors the --values table shows (as --sort/--top ask, else what differs first), and whether
    there are more than it shows."""
    view = f.view
    if view.sort is not None or view.top is not None:
        table = list(f.values)  # as asked: in --sort order, cut to --top
        if view.top is not None:
            return table, False
        return table[:MAX_LINES], len(table) > MAX_LINES
    shown = list(f.value_mismatch)
    nonzero = [v for v in f.values if v.passed and (v.max_abs > 0 or v.nan_a or v.inf_a)]
    table = shown + nonzero[: max(0, MAX_LINES - len(shown))]
    more = len(table) > MAX_LINES or len(nonzero) + len(shown) > len(table)
    return table[:MAX_LINES], more


def _values_lines(f: ValueFigures, suggested: bool) -> list[str]:
    """The --values section: the count, the table (as --sort/--top ask, else what differs), the rollups."""
    out: list[str] = []
    failed = len(f.value_mismatch)
    out.append(f"values (atol={f.atol:g}, rtol={f.rtol:g}): {f.compared} compared, {failed} outside tolerance")
    if not f.compared:
        tail = "; apply the fix below first)" if suggested else ")"
        out.append("  (no key of equal shape on both sides" + tail)
    view = f.view
    if view.sort is not None or view.top is not None:
        title = f"by {view.sort}" if view.sort is not None else "in A's order"
        out.append(f"  {title}" + (f", first {view.top}" if view.top is not None else "") + ":")
    table, more = _value_rows(f)
    if table:
        out.extend("  " + line for line in _value_table(table).splitlines())
        if more:
            out.append("  ... (--json lists every tensor; --sort and --top choose which are shown)")
    out += _rollup_lines(f)
    return out


def diff_text(report: DiffReport) -> str:
    r = report
    out = [f"A: {r.sides.a}  ({r.sides.a_format}, {r.sides.a_count} tensors)",
           f"B: {r.sides.b}  ({r.sides.b_format}, {r.sides.b_count} tensors)", ""]
    out += _key_lines(r.keys, r.sides)
    if r.rewrite.steps:
        out.append(f"A's keys rewritten before comparing: {r.rules_text()} ({r.rewrite.renamed} renamed)")
    if r.figures.compared_values:
        out += _values_lines(r.figures, r.suggestion is not None)
    meta_rows = _metadata_lines(r.metadata)
    if meta_rows:
        counted = "" if r.fail_on_metadata else " (not counted; --fail-on-metadata counts them)"
        out += _section("metadata differences" + counted, meta_rows, len(meta_rows))
    if r.keys.missing or r.keys.unexpected or r.keys.shape_mismatch:
        out += ["", "load_state_dict(strict=True) would raise:"]
        out.extend(f"  {p}" for p in _torch_message(r.keys))
    out += _fix_lines(r)
    out += _weights_only_lines(r.weights_only)
    if r.warnings:
        out += ["", "warnings:"]
        out.extend(f"  - {w}" for w in r.warnings)
    out += ["", verdict(r)]
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


def _key_lines(keys: KeyDiff, sides: Sides) -> list[str]:
    """The missing, unexpected, shape- and dtype-mismatched keys, folded (``layers.{0..11}.attn``)."""
    out: list[str] = []
    if keys.missing:
        out += _section("missing keys (in B, not in A)", _folded([(k, None) for k in keys.missing], lambda _: ""),
                        len(keys.missing))
    if keys.unexpected:
        out += _section("unexpected keys (in A, not in B)",
                        _folded([(k, None) for k in keys.unexpected], lambda _: ""), len(keys.unexpected))
    if keys.shape_mismatch:
        items = [(m.key, (tuple(m.a), tuple(m.b))) for m in keys.shape_mismatch]
        out += _section("shape mismatch (A -> B)",
                        _folded(items, lambda s: f"{shape_str(s[0])} -> {shape_str(s[1])}"), len(keys.shape_mismatch))
    if keys.dtype_mismatch:
        out += _dtype_lines(keys.dtype_mismatch, sides)
    return out


def _dtype_lines(mismatch: Sequence[Mismatch], sides: Sides) -> list[str]:
    items = [(m.key, (m.a, m.b)) for m in mismatch]
    pairs = {label for _, label in items}
    if len(pairs) == 1 and len(items) > 3:
        (a_dt, b_dt), = pairs
        rows = [f"all {len(items)} keys: {a_dt} -> {b_dt}"]
    else:
        rows = _folded(items, lambda s: f"{s[0]} -> {s[1]}")
    out = _section("dtype mismatch (A -> B)", rows, len(mismatch))
    if sides.b_kind == "target":
        out.append("  (load_state_dict casts these while copying; nothing fails)")
    else:
        out.append(f"  (to convert A: ckpt migrate ... --dtype {mismatch[0].b})")
    return out


def _fix_lines(r: DiffReport) -> list[str]:
    """The suggested rewrite and what it leaves, then the ``ckpt migrate`` command that applies it."""
    s = r.suggestion
    if s is None:
        if r.rewrite.steps and r.rewrite.renamed:
            return ["", "to write A with the keys it was compared under:", *_save_first(r), f"  {r.migrate_command()}"]
        return []
    remain = [f"{n} {what}" for n, what in ((s.remaining_missing, "missing"),
                                            (s.remaining_unexpected, "unexpected"),
                                            (s.remaining_shape_mismatch, "shape mismatch(es)")) if n]
    left = ("; still left: " + ", ".join(remain)) if remain else "; no key differences remain"
    given = f" (after {r.rules_text()}, given)" if r.rewrite.steps else ""
    dropped = r.dropped_by_fix()
    drops = (f" and leaves out {len(dropped)} the other side lacks ({', '.join(dropped[:4])}"
             + (f" and {len(dropped) - 4} more" if len(dropped) > 4 else "") + ")") if dropped else ""
    return ["", f"fix: {s.rules.describe()}{given}  reconciles {s.reconciled} key(s){drops}{left}",
            *_save_first(r), f"  {r.migrate_command()}"]


def _save_first(r: DiffReport) -> list[str]:
    """An in-memory A has no path for migrate: the command names the file to save it to first."""
    return ["  (A is in memory: save it first, torch.save(state_dict, 'a.pth'), then)"] if r.a_in_memory else []


def _weights_only_lines(pair: WeightsOnlyPair) -> list[str]:
    """torch.load(weights_only=True) of each side: one line each, the fix only for a side that needs one."""
    sides = [(label, wo) for label, wo in (("A", pair.a), ("B", pair.b)) if wo is not None]
    if not sides:
        return []
    out = ["", "weights_only:"]
    for label, wo in sides:
        first, *rest = wo.lines()
        out.append(f"  {label}: {first}")
        out.extend(f"     {line}" for line in rest)
    return out


def verdict(r: DiffReport) -> str:
    """The one-line result (all that ``-q`` prints)."""
    if r.equal:
        if r.sides.b_kind == "target":
            return "result: A loads into the target with strict=True (no differences)"
        if not r.figures.compared_values:
            return "result: no key, shape or dtype differences (values not compared; --values compares them)"
        return "result: no differences (keys, shapes, dtypes and values)"
    keys = r.keys
    counts = [f"{n} {name}" for name, n in (
        ("missing", len(keys.missing)), ("unexpected", len(keys.unexpected)),
        ("shape mismatch", len(keys.shape_mismatch)), ("dtype mismatch", len(keys.dtype_mismatch)),
        ("value mismatch", len(r.figures.value_mismatch))) if n]
    if r.fail_on_metadata and r.metadata.differs:
        counts.append("metadata differs")
    return "result: differences: " + ", ".join(counts)
