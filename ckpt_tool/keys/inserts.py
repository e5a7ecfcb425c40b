"""Renames that insert or remove one path component, and drops of an extra head.

PEFT names an adapter's weight ``...q_proj.lora_A.weight`` in the adapter
file and ``...q_proj.lora_A.default.weight`` in the PeftModel's state_dict
(the adapter name inserted before the tensor's own name): a rename of one
component (candidates.py) cannot say that, an insertion can, in either
direction. And a checkpoint with a head the target lacks (``classifier.*``)
loads once that head is dropped: ``--drop 'classifier.*'``.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ..model import TensorMeta

_MAX_PAIRS = 200_000


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\")


def _alternatives(names: Sequence[str]) -> str:
    """A regex group matching any of ``names`` (one name: no alternation to read)."""
    escaped = sorted(re.escape(n) for n in names)
    return f"({escaped[0]})" if len(escaped) == 1 else f"({'|'.join(escaped)})"


def _insert_rule(befores: Sequence[str], after: str | None, tail: bool, new: str) -> tuple[str, str]:
    """``...A.B...`` -> ``...A.NEW.B...`` for each A in ``befores`` (B: ``after``; None at the key's end).

    Several A's with the same insertion make one rule (``(lora_A|lora_B)``):
    PEFT inserts its adapter name after each of them, and only the rule that
    covers them all removes every difference the search weighs.
    """
    head = rf"(.*)\.{_alternatives(befores)}"
    if after is None:
        return head, rf"\1.\2.{_esc(new)}"
    pattern = head + rf"\.{re.escape(after)}" + (r"\.(.*)" if tail else "")
    return pattern, rf"\1.\2.{_esc(new)}.{_esc(after)}" + (r".\3" if tail else "")


def _remove_rule(befores: Sequence[str], gone: str, after: str | None, tail: bool) -> tuple[str, str]:
    """``...A.X.B...`` -> ``...A.B...`` for each A in ``befores``: the component X (``gone``) removed."""
    head = rf"(.*)\.{_alternatives(befores)}\.{re.escape(gone)}"
    if after is None:
        return head, r"\1.\2"
    pattern = head + rf"\.{re.escape(after)}" + (r"\.(.*)" if tail else "")
    return pattern, rf"\1.\2.{_esc(after)}" + (r".\3" if tail else "")


def _inserted_at(short: Sequence[str], long: Sequence[str]) -> int | None:
    """The index where ``long`` holds one component more than ``short`` (None: they differ otherwise)."""
    i = 0
    while i < len(short) and short[i] == long[i]:
        i += 1
    return i if list(short[i:]) == list(long[i + 1:]) and i > 0 else None


def insertion_candidates(unmatched: Sequence[tuple[str, TensorMeta]],
                         missing: Mapping[str, tuple[int, ...]]) -> Counter[tuple[str, str]]:
    """Rules that insert (or remove) one component, counted over the unmatched/missing pairs they explain."""
    by_len: dict[tuple[int, tuple[int, ...]], list[list[str]]] = {}
    for key, shape in missing.items():
        parts = key.split(".")
        by_len.setdefault((len(parts), shape), []).append(parts)
    counts: Counter[tuple[str, str]] = Counter()
    inserts: dict[tuple[str | None, bool, str], Counter[str]] = {}
    removes: dict[tuple[str | None, bool, str], Counter[str]] = {}
    pairs = 0
    for key, t in unmatched:
        parts = key.split(".")
        for other in by_len.get((len(parts) + 1, t.shape), ()):
            pairs += 1
            if pairs > _MAX_PAIRS:
                break
            i = _inserted_at(parts, other)
            if i is not None:
                after = parts[i] if i < len(parts) else None
                inserts.setdefault((after, i < len(parts) - 1, other[i]), Counter())[parts[i - 1]] += 1
        for other in by_len.get((len(parts) - 1, t.shape), ()):
            pairs += 1
            if pairs > _MAX_PAIRS:
                break
            i = _inserted_at(other, parts)
            if i is not None:
                after = parts[i + 1] if i + 1 < len(parts) else None
                removes.setdefault((after, i + 1 < len(parts) - 1, parts[i]), Counter())[parts[i - 1]] += 1
    for (after, tail, new), befores in inserts.items():
        for before, n in befores.items():
            counts[_insert_rule([before], after, tail, new)] += n
        if len(befores) > 1:
            counts[_insert_rule(list(befores), after, tail, new)] += sum(befores.values()) + 1
    for (after, tail, gone), befores in removes.items():
        for before, n in befores.items():
            counts[_remove_rule([before], gone, after, tail)] += n
        if len(befores) > 1:
            counts[_remove_rule(list(befores), gone, after, tail)] += sum(befores.values()) + 1
    return counts


def head_drop(unexpected: Iterable[str], kept: Iterable[str]) -> str | None:
    """``PREFIX.*`` when every unexpected key lies under one module and no kept key does (else None).

    The deepest shared module is named, so that ``--drop`` removes the head
    and nothing else (``classifier.*``, ``heads.cls.*``).
    """
    keys = [k.split(".") for k in unexpected]
    if not keys or any(len(k) < 2 for k in keys):
        return None
    common = keys[0][:-1]
    for k in keys[1:]:
        n = 0
        while n < min(len(common), len(k) - 1) and common[n] == k[n]:
            n += 1
        common = common[:n]
    if not common:
        return None
    prefix = ".".join(common) + "."
    if any(k.startswith(prefix) for k in kept):
        return None
    return prefix + "*"
