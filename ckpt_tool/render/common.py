"""Small formatting helpers shared by the text renderers."""
from __future__ import annotations

import json
import re
from typing import Any, Iterable


def human_bytes(n: int | float) -> str:
    step = 1024.0
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < step or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= step
    return f"{value:.1f} TiB"


def human_count(n: int) -> str:
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f}B"
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 10_000:
        return f"{n / 1e3:.1f}K"
    return str(n)


def shape_str(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def dumps(doc: Any) -> str:
    """The one JSON document a --json command prints."""
    return json.dumps(doc, indent=2, sort_keys=False, default=str, allow_nan=False)


_INDEX = re.compile(r"(?<=\.)(\d+)(?=\.)|(?<=^)(\d+)(?=\.)")


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold repeated layer indices: layers.0.w ... layers.31.w -> layers.{0..31}.w.

    Keys that differ only in numeric path components are grouped; each group
    is shown once with its indices as a range (or a list when not contiguous).
    """
    groups: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    order: list[tuple[str, ...]] = []
    for key in keys:
        parts = key.split(".")
        pattern = tuple("{}" if p.isdigit() else p for p in parts)
        nums = tuple(int(p) for p in parts if p.isdigit())
        if pattern not in groups:
            groups[pattern] = []
            order.append(pattern)
        groups[pattern].append(nums)
    out = []
    for pattern in order:
        members = groups[pattern]
        if len(members) == 1 or "{}" not in pattern:
            for nums in members:
                it = iter(nums)
                out.append(".".join(str(next(it)) if p == "{}" else p for p in pattern))
            continue
        slots = [sorted({m[i] for m in members}) for i in range(len(members[0]))]
        rendered = []
        slot_iter = iter(slots)
        for p in pattern:
            if p != "{}":
                rendered.append(p)
                continue
            values = next(slot_iter)
            rendered.append(_range_text(values))
        out.append(".".join(rendered) + f"  ({len(members)} keys)")
    return out


def _range_text(values: list[int]) -> str:
    if len(values) == 1:
        return str(values[0])
    if values == list(range(values[0], values[-1] + 1)):
        return "{" + f"{values[0]}..{values[-1]}" + "}"
    return "{" + ",".join(str(v) for v in values) + "}"
