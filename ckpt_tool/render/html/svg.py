"""The pictures of the diff report, as inline SVG text: a heatmap of layer x role and small histograms.

Written by hand rather than with a plotting library: a few rectangles and
labels, no new dependency, and nothing a browser has to fetch. Colours that
must read on light and dark backgrounds are CSS variables (assets.py);
the heatmap scale is a fixed sequential ramp that stays legible on both.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from ...commands.diff import common_prefix, layer_and_role
from ...tensors.numerics import BINS, LOW_EXP, PER_DECADE, SIDE, ValueDiff

# a sequential ramp (low change -> high change), readable on white and on near-black
_RAMP = [(49, 54, 149), (69, 117, 180), (116, 173, 209), (171, 217, 233), (254, 224, 144), (253, 174, 97),
         (244, 109, 67), (215, 48, 39), (165, 0, 38)]


def ramp(t: float) -> str:
    """The ramp's colour at ``t`` in [0, 1], as ``rgb(...)``."""
    t = min(1.0, max(0.0, t)) * (len(_RAMP) - 1)
    i = min(int(t), len(_RAMP) - 2)
    f = t - i
    r, g, b = (round(x + (y - x) * f) for x, y in zip(_RAMP[i], _RAMP[i + 1], strict=True))
    return f"rgb({r},{g},{b})"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else str(x)


class Scale:
    """log10(rel_l2) mapped onto the ramp, from the smallest non-zero change to the largest finite one."""

    def __init__(self, values: Sequence[float]) -> None:
        finite = [math.log10(v) for v in values if v > 0 and math.isfinite(v)]
        self.lo = min(finite) if finite else 0.0
        self.hi = max(finite) if finite else 0.0

    def colour(self, x: float) -> str:
        if x != x or math.isinf(x):
            return "var(--bad)"
        if x <= 0:
            return "var(--same)"
        if self.hi <= self.lo:
            return ramp(1.0)
        return ramp((math.log10(x) - self.lo) / (self.hi - self.lo))


def heatmap(values: Sequence[ValueDiff]) -> str | None:
    """Layer index (columns) x parameter role (rows), each cell coloured by the tensor's rel_l2; None when no
    key holds a layer index. A role present in some layers only leaves the other cells empty."""
    cells: dict[tuple[str, int], ValueDiff] = {}
    for v in values:
        found = layer_and_role(v.key)
        if found is not None:
            layer, role = found
            cells.setdefault((role, layer), v)
    if not cells:
        return None
    roles = sorted({role for role, _ in cells})
    shared = common_prefix(roles)  # model.layers.*. on every row: said once, above the rows
    layers = sorted({layer for _, layer in cells})
    scale = Scale([v.rel_l2 for v in cells.values()])
    cw, ch = max(8, min(40, 900 // max(1, len(layers)))), 18
    left = min(360, 12 + 7 * max(len(r) - len(shared) for r in roles))
    top, legend = 34, 46
    width, height = max(left + cw * len(layers) + 10, left + 420), top + ch * len(roles) + legend
    out = [f'<svg class="heatmap" role="img" aria-label="relative change per layer and role" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}">']
    step = max(1, math.ceil(len(layers) / (900 / 28)))
    for j, layer in enumerate(layers):
        if j % step == 0:
            out.append(f'<text class="tick" x="{left + j * cw + cw / 2:.1f}" y="{top - 8}" '
                       f'text-anchor="middle">{layer}</text>')
    for i, role in enumerate(roles):
        y = top + i * ch
        out.append(f'<text class="tick" x="{left - 6}" y="{y + ch * 0.7:.1f}" text-anchor="end">'
                   f"{escape(role[len(shared):])}</text>")
        for j, layer in enumerate(layers):
            cell = cells.get((role, layer))
            if cell is None:
                continue
            tip = f"{cell.key}: rel_l2 {_fmt(cell.rel_l2)}, cosine {_fmt(cell.cosine)}, max_abs {_fmt(cell.max_abs)}"
            out.append(f'<rect class="cell" x="{left + j * cw}" y="{y}" width="{cw - 1}" height="{ch - 1}" '
                       f'fill="{scale.colour(cell.rel_l2)}" data-key="{escape(cell.key)}">'
                       f"<title>{escape(tip)}</title></rect>")
    ly = top + ch * len(roles) + 16
    for k in range(50):
        out.append(f'<rect x="{left + k * 4}" y="{ly}" width="4" height="10" fill="{ramp(k / 49)}"/>')
    lo, hi = (f"{10 ** scale.lo:.2g}", f"{10 ** scale.hi:.2g}")
    out.append(f'<text class="tick" x="{left}" y="{ly + 24}">{lo}</text>')
    out.append(f'<text class="tick" x="{left + 200}" y="{ly + 24}" text-anchor="end">{hi}</text>')
    out.append(f'<rect x="{left + 214}" y="{ly}" width="10" height="10" fill="var(--same)"/>'
               f'<text class="tick" x="{left + 228}" y="{ly + 9}">no change</text>')
    out.append(f'<rect x="{left + 300}" y="{ly}" width="10" height="10" fill="var(--bad)"/>'
               f'<text class="tick" x="{left + 314}" y="{ly + 9}">inf / NaN</text>')
    where = f" of {escape(shared)}" if shared else ""
    out.append(f'<text class="tick" x="{left}" y="{top - 22}">layer index{where}; colour: rel_l2 = '
               "||B-A||/||A|| (log scale)</text>")
    out.append("</svg>")
    return "".join(out)


def histogram(counts: Sequence[int], title: str) -> str:
    """Bars of a fixed-bin histogram (tensors/histograms.py): share of the sampled elements per bin."""
    w, h, pad = 260, 90, 14
    total = sum(counts) or 1
    peak = max(counts) / total if any(counts) else 1.0
    bw = (w - 2) / BINS
    out = [f'<svg class="hist" role="img" aria-label="{escape(title)}" width="{w}" height="{h + 2 * pad}" '
           f'viewBox="0 0 {w} {h + 2 * pad}"><text class="tick" x="2" y="10">{escape(title)}</text>']
    for i, c in enumerate(counts[:BINS]):
        if not c:
            continue
        bh = (c / total) / peak * (h - 4)
        cls = "bar zero" if i == SIDE else "bar"
        out.append(f'<rect class="{cls}" x="{1 + i * bw:.2f}" y="{pad + h - bh:.2f}" width="{max(bw - 0.3, 0.5):.2f}" '
                   f'height="{bh:.2f}"><title>{c / total:.2%}</title></rect>')
    out.append(f'<line class="axis" x1="0" x2="{w}" y1="{pad + h}" y2="{pad + h}"/>')
    for exp in (0, -4):  # ticks at +-1 and +-1e-4, at the edge of the bin that starts there
        k = (exp - LOW_EXP) * PER_DECADE
        text = "1" if exp == 0 else f"1e{exp}"
        for sign, x in ((1, 1 + (SIDE + 1 + k) * bw), (-1, 1 + (SIDE - k) * bw)):
            out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{pad + h}" y2="{pad + h + 3}"/>'
                       f'<text class="tick" x="{x:.1f}" y="{pad + h + 13}" text-anchor="middle">'
                       f'{"-" if sign < 0 else ""}{text}</text>')
    out.append(f'<text class="tick" x="{1 + SIDE * bw + bw / 2:.1f}" y="{pad + h + 13}" text-anchor="middle">0</text>')
    out.append("</svg>")
    return "".join(out)
