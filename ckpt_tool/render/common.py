"""Small formatting helpers shared by the text renderers."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from itertools import repeat
from typing import Any

from ..errors import WriteError
from ..units import human_bytes as human_bytes  # re-exported for the renderers


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
    """The one JSON document a --json command prints.

    Indented for a person at a terminal; compact otherwise, which lets the C
    encoder run (indenting is 20x slower on a 200,000-tensor report).
    """
    indent = 2 if sys.stdout.isatty() else None
    return json.dumps(doc, indent=indent, default=str, allow_nan=False)


def fold_keys(keys: Iterable[str]) -> list[str]:
    """Fold repeated layer indices: layers.0.w ... layers.31.w -> layers.{0..31}.w.

    Keys that differ only in numeric path components are grouped; each group
    is shown once with its indices as a range (or a list when not contiguous).
    Every line stands for exactly the keys it names (a cross product of its
    index sets), so nothing is implied that is not there.
    """
    out = []
    for text, _, count in fold_labeled((k, "") for k in keys):
        out.append(text if count == 1 else f"{text}  ({count} keys)")
    return out


def fold_labeled(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any, int]]:
    """Fold keys that share a label (a shape, a dtype pair): ``[(folded key, label, key count)]``.

    Keys fold only with keys of the same label and the same non-numeric path;
    output follows the first appearance of each group.
    """
    groups: dict[tuple[tuple[str, ...], Any], list[tuple[int, ...]]] = {}
    for key, label in items:
        parts = key.split(".")
        pattern = tuple("{}" if _is_index(p) else p for p in parts)
        nums = tuple(int(p) for p in parts if _is_index(p))
        groups.setdefault((pattern, label), []).append(nums)
    out: list[tuple[str, Any, int]] = []
    for (pattern, label), members in groups.items():
        for sets in _fold_members(members):
            it = iter(sets)
            text = ".".join(_range_text(sorted(next(it))) if p == "{}" else p for p in pattern)
            count = 1
            for s in sets:
                count *= len(s)
            out.append((text, label, count))
    return out


def _is_index(part: str) -> bool:
    return part.isdigit() and (part == "0" or not part.startswith("0"))


def _fold_members(members: list[tuple[int, ...]]) -> list[tuple[frozenset[int], ...]]:
    """Merge index tuples into cross products, folding the last index first (layers.{0..31}.experts.{0..7})."""
    entries: list[tuple[frozenset[int], ...]] = []
    seen = set()
    for m in members:
        if m not in seen:
            seen.add(m)
            entries.append(tuple(frozenset((n,)) for n in m))
    if not entries or not entries[0]:
        return entries
    for slot in reversed(range(len(entries[0]))):
        merged: dict[tuple[frozenset[int], ...], set[int]] = {}
        for e in entries:
            rest = e[:slot] + e[slot + 1:]
            merged.setdefault(rest, set()).update(e[slot])
        entries = [(*rest[:slot], frozenset(vals), *rest[slot:]) for rest, vals in merged.items()]
    return entries


def _range_text(values: list[int]) -> str:
    if len(values) == 1:
        return str(values[0])
    if values == list(range(values[0], values[-1] + 1)):
        return "{" + f"{values[0]}..{values[-1]}" + "}"
    return "{" + ",".join(str(v) for v in values) + "}"


def simple_table(rows: list[list[str]], headers: list[str]) -> str:
    """``tabulate(rows, headers, tablefmt="simple", disable_numparse=True)``, fast.

    tabulate formats a 200,000-row table in tens of seconds and costs 60 ms
    to import; this writes the same text for plain cells (strings of
    printable ASCII, as ckpt's tables hold) and hands anything else (wide
    characters, newlines, escape codes, non-string cells) to tabulate.
    """
    return simple_columns(list(zip(*rows, strict=False)) if rows else [[] for _ in headers], headers)


def simple_columns(columns: list[Any], headers: list[str]) -> str:
    """simple_table for a table held column by column (the columns are not modified)."""
    columns = list(columns)
    for i, col in enumerate(columns):
        joined = "".join(col) if set(map(type, col)) <= {str} else None
        if joined is None or not joined.isascii() or not joined.isprintable():
            from tabulate import tabulate

            return str(tabulate(list(zip(*columns, strict=False)), headers=headers, tablefmt="simple",
                                disable_numparse=True))
        if " " in joined:  # tabulate strips each cell (only spaces can be there: the text is printable)
            columns[i] = list(map(str.strip, col))
    widths = [max(len(h) + 2, max(map(len, col), default=0)) for h, col in zip(headers, columns, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip(),
             "  ".join("-" * w for w in widths)]
    if columns and len(columns[0]):
        # column-wise C-speed maps: pad every column but the last, join, strip the line ends
        padded = [list(map(str.ljust, col, repeat(w))) for col, w in zip(columns[:-1], widths, strict=False)]
        padded.append(columns[-1])
        lines.extend(map(str.rstrip, map("  ".join, zip(*padded, strict=False))))
    return "\n".join(lines)


def write_report(data: bytes, path: str, what: str) -> None:
    """``data`` into a temporary beside ``path`` (io/atomic AtomicFile), fsynced, renamed into place, the
    folder fsynced: a crash leaves the old report or the new one, never half of one."""
    from ..io.atomic import AtomicFile  # only when a report is written

    try:
        with AtomicFile(path) as out:
            if out.fd is None:  # AtomicFile opens it on entering: a bug, never the user's doing
                raise RuntimeError(f"the temporary file for {path} is not open")
            view = memoryview(data)
            while view:
                view = view[os.write(out.fd, view):]
            out.publish()
    except OSError as exc:  # creating the temporary (its folder gone, read-only, full): one line, exit 2
        raise WriteError(f"cannot write the {what}: {exc.strerror or exc}", path) from None
