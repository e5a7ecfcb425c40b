"""Scoring a candidate key rewrite against the target's keys and shapes.

A score counts what would still differ after the rewrite (missing,
unexpected, wrong shape); on large key sets candidates are first ranked on
a sample, so that scoring stays fast on 100k keys.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..model import TensorMeta, shapes_compatible
from .rules import RuleSet

MAX_SAMPLED_KEYS = 5000
T = TypeVar("T")


def sample(items: Sequence[T]) -> Sequence[T]:
    """At most MAX_SAMPLED_KEYS items, spread evenly over ``items`` (all of them when fewer)."""
    if len(items) <= MAX_SAMPLED_KEYS:
        return items
    step = len(items) / MAX_SAMPLED_KEYS
    return [items[int(i * step)] for i in range(MAX_SAMPLED_KEYS)]


@dataclass(frozen=True)
class Score:
    """What still differs after one rewrite: what the search ranks rewrites by and compares them on."""

    missing: int
    unexpected: int
    shape_bad: int
    matched: frozenset[str]  # source keys that land on a target key of a compatible shape
    renamed: int
    landed: frozenset[str] = frozenset()  # target keys that some source key lands on

    @property
    def differences(self) -> int:
        return self.missing + self.unexpected + self.shape_bad


def _mapper(rules: RuleSet) -> Callable[[str], str]:
    """``rules.new_key`` for strip/add/rename, fast enough to score many candidates on 100k keys.

    ``re.Match.expand`` re-parses its template on every call; an anchored
    ``subn`` caches it. The suggestion is checked against rules.new_key.
    """
    strips = rules.strip_prefix
    add = rules.add_prefix or ""
    renames = [(re.compile(r"\A(?:" + p + r")\Z"), r) for p, r in rules.rename]

    def new_key(key: str) -> str:
        for p in strips:
            key = key.removeprefix(p)
        key = add + key
        for pattern, repl in renames:
            out, n = pattern.subn(repl, key, count=1)
            if n:
                key = out
        return key

    return new_key


class Scorer:
    """Scores rewrites of ``source``'s keys against ``target``, each rewrite once."""

    def __init__(self, source: Sequence[TensorMeta], target: Sequence[TensorMeta], lazy: Iterable[str]) -> None:
        self.source = list(source)
        self.target = {t.key: t.shape for t in target}
        self.lazy = set(lazy)
        self.cache: dict[RuleSet, Score | None] = {}

    def shortlist(self, candidates: Sequence[RuleSet], keep: int = 4) -> list[RuleSet]:
        """On big key sets, only the candidates that do best on a sample of keys are scored in full."""
        if len(self.source) <= MAX_SAMPLED_KEYS or len(candidates) <= keep:
            return list(candidates)
        picked = sample(self.source)

        simplest: dict[tuple[str, ...], tuple[int, RuleSet]] = {}
        for rules in sorted(candidates, key=cost):
            new_key = _mapper(rules)
            outputs = tuple(new_key(t.key) for t in picked)
            if outputs in simplest:
                continue  # the same mapping as a simpler rule: e.g. a regex that only strips a prefix
            n = 0
            for out, t in zip(outputs, picked, strict=True):
                shape = self.target.get(out)
                n += shape is not None and shapes_compatible(t.shape, shape)
            simplest[outputs] = (n, rules)
        ranked = sorted(simplest.values(), key=lambda x: -x[0])
        cutoff = ranked[min(keep, len(ranked)) - 1][0]
        return [r for h, r in ranked if h >= cutoff]

    def outputs(self, rules: RuleSet) -> list[str] | None:
        """Each source key's new key, or None when two would merge (never a valid suggestion)."""
        new_key = _mapper(rules)
        out = [new_key(t.key) for t in self.source]
        if len(set(out)) != len(out) or "" in out:
            return None
        return out

    def score(self, rules: RuleSet) -> Score | None:
        if rules in self.cache:
            return self.cache[rules]
        outputs = self.outputs(rules)
        result = None if outputs is None else self._score(outputs)
        self.cache[rules] = result
        return result

    def _score(self, outputs: Sequence[str]) -> Score:
        matched: set[str] = set()
        used: set[str] = set()
        unexpected = shape_bad = renamed = 0
        for out, t in zip(outputs, self.source, strict=False):
            if out != t.key:
                renamed += 1
            shape = self.target.get(out)
            if shape is None:
                unexpected += 1
                continue
            used.add(out)
            if out in self.lazy or shapes_compatible(t.shape, shape):
                matched.add(t.key)
            else:
                shape_bad += 1
        return Score(len(self.target) - len(used), unexpected, shape_bad, frozenset(matched), renamed,
                      frozenset(used))

    def agrees_with_migrate(self, rules: RuleSet) -> bool:
        """Whether migrate's own rules.new_key maps the keys as the fast mapper did (checked on a sample)."""
        new_key = _mapper(rules)
        step = max(1, len(self.source) // MAX_SAMPLED_KEYS)
        return all(rules.new_key(t.key) == new_key(t.key) for t in self.source[::step])

    def residual(self, rules: RuleSet) -> tuple[list[tuple[str, TensorMeta]], dict[str, tuple[int, ...]]]:
        """(source keys after ``rules`` that match nothing, target keys nothing lands on)."""
        new_key = _mapper(rules)
        unmatched = []
        used = set()
        for t in self.source:
            out = new_key(t.key)
            if out in self.target:
                used.add(out)
            else:
                unmatched.append((out, t))
        missing = {k: s for k, s in self.target.items() if k not in used}
        return unmatched, missing


def cost(rules: RuleSet) -> tuple[int, int]:
    """Simpler rules first: a regex counts as more than a prefix, then the shorter text."""
    n_rules = len(rules.strip_prefix) + (1 if rules.add_prefix else 0) + 3 * len(rules.rename)
    return (n_rules, len(rules.describe()))


def rank(score: Score, rules: RuleSet) -> tuple[int, int, int, int]:
    """Fewer differences first; then simpler rules; then fewer keys touched."""
    n_rules, text = cost(rules)
    return (score.differences, n_rules, score.renamed, text)
