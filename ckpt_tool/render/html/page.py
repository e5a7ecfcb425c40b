"""The HTML diff report: one self-contained document (inline style, script and SVG; no URL anywhere).

Sections, in the order a reader needs them: the verdict and the fix command,
the key differences, the heatmap of layer x role, the rollups, the sortable
per-tensor table, the histograms of the tensors that changed most, warnings.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ...commands.diff import DiffReport, ordered
from ...format_names import DiffMetric
from ...tensors.numerics import ValueDiff
from ..diff import cosine_text, verdict
from .assets import CSS, JS
from .svg import heatmap, histogram

MAX_ROWS = 5000  # rows of the per-tensor table in the page (the CSV holds every one)


def _num(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _cos(x: float) -> str:
    return cosine_text(x)


def _data(x: float) -> str:
    return repr(x) if math.isfinite(x) else str(x)


def _keys_section(title: str, keys: Sequence[str]) -> str:
    if not keys:
        return ""
    shown = "".join(f"<li><code>{escape(k)}</code></li>" for k in keys[:200])
    more = f"<li class='muted'>... {len(keys) - 200} more (--json lists every key)</li>" if len(keys) > 200 else ""
    return f"<h2>{escape(title)}: {len(keys)}</h2><ul>{shown}{more}</ul>"


def _value_rows(values: Sequence[ValueDiff]) -> str:
    rows = []
    for v in values[:MAX_ROWS]:
        cells = [
            f"<td>{escape(v.key)}</td>",
            f'<td data-v="{v.numel}">{v.numel:,}</td>',
            f'<td data-v="{_data(v.max_abs)}">{_num(v.max_abs)}</td>',
            f'<td data-v="{_data(v.max_rel)}">{_num(v.max_rel)}</td>',
            f'<td data-v="{_data(v.mean_abs)}">{_num(v.mean_abs)}</td>',
            f'<td data-v="{_data(v.rel_l2)}">{_num(v.rel_l2)}</td>',
            f'<td data-v="{_data(v.cosine)}">{_cos(v.cosine)}</td>',
            f'<td data-v="{_data(v.mismatched_share)}">{v.mismatched_share:.2%}</td>',
            f'<td data-v="{v.nan_a + v.nan_b}">{v.nan_a}/{v.nan_b}</td>',
            f'<td data-v="{v.inf_a + v.inf_b}">{v.inf_a}/{v.inf_b}</td>',
            f"<td>{escape(v.compared_as)}</td>",
            f'<td class="{"ok" if v.passed else "fail"}">{"ok" if v.passed else "FAIL"}</td>',
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(rows)


_HEADERS = ["key", "numel", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine", "outside tol", "nan a/b",
            "inf a/b", "compared as", "result"]


def _rollup_table(r: DiffReport) -> str:
    if not r.rollups:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ["group", "tensors", "numel", "max_abs", "mean_abs", "rel_l2", "cosine",
                                             "outside tol"])
    body = "".join(
        f"<tr><td>{escape(g.name)}</td><td data-v='{g.tensors}'>{g.tensors:,}</td><td data-v='{g.numel}'>"
        f"{g.numel:,}</td><td data-v='{_data(g.max_abs)}'>{_num(g.max_abs)}</td><td data-v='{_data(g.mean_abs)}'>"
        f"{_num(g.mean_abs)}</td><td data-v='{_data(g.rel_l2)}'>{_num(g.rel_l2)}</td>"
        f"<td data-v='{_data(g.cosine)}'>{_cos(g.cosine)}</td><td data-v='{_data(g.mismatched_share)}'>"
        f"{g.mismatched_share:.2%}</td></tr>" for g in r.rollups[:MAX_ROWS])
    return ("<h2>Rollups</h2><p class='muted'>mean_abs and outside tol are element-weighted; rel_l2 and cosine "
            "treat each group as one vector.</p>"
            f"<div class='scroll'><table class='sortable rollups'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def _histograms(values: Sequence[ValueDiff], metric: DiffMetric) -> str:
    with_bins = ordered([v for v in values if v.hist_a], metric, None)
    if not with_bins:
        return ""
    rows = []
    for v in with_bins:
        rows.append(f"<div class='hrow'><div class='k'><code>{escape(v.key)}</code> "
                    f"<span class='muted'>rel_l2 {_num(v.rel_l2)}, cosine {_cos(v.cosine)}</span></div>"
                    f"{histogram(v.hist_a, 'A')}{histogram(v.hist_b, 'B')}{histogram(v.hist_diff, 'B - A')}</div>")
    return ("<h2>Histograms of the tensors that changed most</h2><p class='muted'>Signed log scale, four bins per "
            "decade of |x| from 1e-8 to 1e2 (the grey middle bar: |x| &lt; 1e-8); each chunk of 262,144 elements "
            "sampled to at most 65,536; NaN and Inf are counted in the table, not binned.</p>"
            f"<div class='hists'>{''.join(rows)}</div>")


def html_text(r: DiffReport) -> str:
    """The whole report as one HTML document."""
    line = verdict(r)
    status = "ok" if r.equal else "fail"
    fix = r.migrate_command()
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>ckpt diff: {escape(r.a)} vs {escape(r.b)}</title><style>{CSS}</style></head><body>",
        "<h1>ckpt diff</h1>",
        f"<p class='muted'>A: <code>{escape(r.a)}</code> ({escape(r.a_format)}, {r.a_count} tensors)<br>"
        f"B: <code>{escape(r.b)}</code> ({escape(r.b_format)}, {r.b_count} tensors)<br>"
        f"atol {r.atol:g}, rtol {r.rtol:g}; {r.compared} tensor pair(s) compared, {len(r.value_mismatch)} outside "
        "tolerance</p>",
        f"<p class='verdict {status}' id='verdict'>{escape(line)}</p>",
    ]
    if r.rule_steps:
        parts.append(f"<p>A's keys were rewritten before comparing: <code>{escape(r.rules_text())}</code> "
                     f"({r.renamed} renamed).</p>")
    if fix:
        parts.append(f"<h2>Fix</h2><pre id='fix'>{escape(fix)}</pre>")
    parts.append(_keys_section("Missing keys (in B, not in A)", r.missing))
    parts.append(_keys_section("Unexpected keys (in A, not in B)", r.unexpected))
    parts.append(_keys_section("Shape mismatches (A -> B)", [f"{m.key}: {m.a} -> {m.b}" for m in r.shape_mismatch]))
    parts.append(_keys_section("dtype mismatches (A -> B)", [f"{m.key}: {m.a} -> {m.b}" for m in r.dtype_mismatch]))
    svg = heatmap(r.all_values or r.values)
    parts.append("<h2>Relative change per layer and role</h2>")
    parts.append(svg if svg is not None else "<p class='muted'>No key holds a layer index (such as "
                                              "<code>layers.3.</code>): no heatmap.</p>")
    parts.append(_rollup_table(r))
    head = "".join(f"<th>{h}</th>" for h in _HEADERS)
    cut = (f" (the first {MAX_ROWS:,} of {len(r.values):,}; --csv writes every one)"
           if len(r.values) > MAX_ROWS else "")
    order = f"by {r.view.sort}" if r.view.sort is not None else "in A's order"
    parts.append(f"<h2>Per tensor</h2><p class='muted'>{len(r.values):,} row(s) {order}{cut}; click a header to "
                 "sort. rel_l2 = ||B-A||/||A||; cosine as torch.nn.functional.cosine_similarity of the "
                 "flattened tensors.</p>"
                 f"<div class='scroll'><table class='sortable values' id='values'><thead><tr>{head}</tr></thead>"
                 f"<tbody>{_value_rows(r.values)}</tbody></table></div>")
    parts.append(_histograms(r.all_values or r.values, r.view.sort or DiffMetric.REL_L2))
    if r.warnings:
        items = "".join(f"<li>{escape(w)}</li>" for w in r.warnings)
        parts.append(f"<h2>Warnings</h2><ul class='warn'>{items}</ul>")
    parts.append(f"<script>{JS}</script></body></html>\n")
    return "".join(p for p in parts if p)
