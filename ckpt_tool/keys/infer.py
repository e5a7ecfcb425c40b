"""Infer the key rewrite that makes one key set load into another.

Candidate rules (wrapper prefixes, prefixes found by matching key suffixes,
shape-preserving renames of one path component) are each applied to the
source keys and scored against the target's keys and shapes; the best rule
that removes differences wins. Pure metadata: no torch, no tensor bytes.
"""
from __future__ import annotations

import os
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import TensorMeta, shapes_compatible
from .rules import KNOWN_PREFIXES, RuleSet, detect_prefixes

# Wrapper prefixes tried on both sides, most specific first.
WRAPPER_PREFIXES = KNOWN_PREFIXES
# A key suffix shared by more prefixes than this is ambiguous (``weight``) and not used for matching.
_MAX_PREFIXES_PER_SUFFIX = 3
_MAX_SAMPLED_KEYS = 5000
_MAX_DATA_CANDIDATES = 12
_MAX_RENAME_PAIRS = 200_000
_MAX_RENAMES = 8


@dataclass(frozen=True)
class Suggestion:
    """A rewrite of the source's keys and what it achieves against the target."""

    rules: RuleSet
    reconciled: int  # keys that match after the rewrite and did not before
    remaining_missing: int
    remaining_unexpected: int
    remaining_shape_mismatch: int = 0
    renamed: int = 0  # source keys whose name the rewrite changes

    @property
    def complete(self) -> bool:
        """True when the rewrite leaves no key difference at all."""
        return not (self.remaining_missing or self.remaining_unexpected or self.remaining_shape_mismatch)

    def command(self, source: str, output: str | None = None, *, key: str | None = None,
                target: str | None = None, target_kwargs: str | None = None) -> str:
        """The exact ``ckpt migrate`` command that applies the rewrite (shell-quoted)."""
        args = ["ckpt", "migrate", source, "-o", output or default_output(source)]
        if key is not None:
            args += ["--key", key]
        args += self.rules.cli_args()
        if target is not None:
            args += ["--target", target]
            if target_kwargs:
                args += ["--target-kwargs", target_kwargs]
        return " ".join(shlex.quote(a) for a in args)

    def to_json(self) -> dict[str, Any]:
        r = self.rules
        return {
            "rules": {
                "strip_prefix": list(r.strip_prefix),
                "add_prefix": r.add_prefix,
                "rename": [{"pattern": p, "replacement": s} for p, s in r.rename],
            },
            "options": r.cli_args(),
            "reconciled": self.reconciled,
            "renamed": self.renamed,
            "remaining_missing": self.remaining_missing,
            "remaining_unexpected": self.remaining_unexpected,
            "remaining_shape_mismatch": self.remaining_shape_mismatch,
            "complete": self.complete,
        }


def default_output(source: str) -> str:
    """``model.pth`` -> ``model.fixed.pth``; a folder (sharded, DCP) -> ``folder.fixed``."""
    path = source.rstrip("/\\") or source
    if os.path.isdir(path):
        return path + ".fixed"
    stem, ext = os.path.splitext(path)
    if ext == ".json" and stem.endswith(".index"):  # model.safetensors.index.json: a sharded set
        return os.path.dirname(path) + ".fixed" if os.path.dirname(path) else "fixed"
    return f"{stem}.fixed{ext}" if ext else f"{path}.fixed"


# ------------------------------------------------------------------ scoring


@dataclass(frozen=True)
class _Score:
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


class _Scorer:
    def __init__(self, source: Sequence[TensorMeta], target: Sequence[TensorMeta], lazy: Iterable[str]) -> None:
        self.source = list(source)
        self.target = {t.key: t.shape for t in target}
        self.lazy = set(lazy)
        self.cache: dict[RuleSet, _Score | None] = {}

    def shortlist(self, candidates: Sequence[RuleSet], keep: int = 4) -> list[RuleSet]:
        """On big key sets, only the candidates that do best on a sample of keys are scored in full."""
        if len(self.source) <= _MAX_SAMPLED_KEYS or len(candidates) <= keep:
            return list(candidates)
        step = len(self.source) / _MAX_SAMPLED_KEYS
        sample = [self.source[int(i * step)] for i in range(_MAX_SAMPLED_KEYS)]

        simplest: dict[tuple[str, ...], tuple[int, RuleSet]] = {}
        for rules in sorted(candidates, key=_cost):
            new_key = _mapper(rules)
            outputs = tuple(new_key(t.key) for t in sample)
            if outputs in simplest:
                continue  # the same mapping as a simpler rule: e.g. a regex that only strips a prefix
            n = 0
            for out, t in zip(outputs, sample):
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

    def score(self, rules: RuleSet) -> _Score | None:
        if rules in self.cache:
            return self.cache[rules]
        outputs = self.outputs(rules)
        result = None if outputs is None else self._score(outputs)
        self.cache[rules] = result
        return result

    def _score(self, outputs: Sequence[str]) -> _Score:
        matched: set[str] = set()
        used: set[str] = set()
        unexpected = shape_bad = renamed = 0
        for out, t in zip(outputs, self.source):
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
        return _Score(len(self.target) - len(used), unexpected, shape_bad, frozenset(matched), renamed,
                      frozenset(used))

    def agrees_with_migrate(self, rules: RuleSet) -> bool:
        """Whether migrate's own rules.new_key maps the keys as the fast mapper did (checked on a sample)."""
        new_key = _mapper(rules)
        step = max(1, len(self.source) // _MAX_SAMPLED_KEYS)
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


def _cost(rules: RuleSet) -> tuple[int, int]:
    """Simpler rules first: a regex counts as more than a prefix, then the shorter text."""
    n_rules = len(rules.strip_prefix) + (1 if rules.add_prefix else 0) + 3 * len(rules.rename)
    return (n_rules, len(rules.describe()))


def _rank(score: _Score, rules: RuleSet) -> tuple[int, int, int, int]:
    """Fewer differences first; then simpler rules; then fewer keys touched."""
    n_rules, text = _cost(rules)
    return (score.differences, n_rules, score.renamed, text)


# ------------------------------------------------------------------ candidates


def _prefixes_of(key: str) -> Iterable[tuple[str, str]]:
    """Every (dotted prefix, rest) split of a key; the prefix ends with a dot or is empty."""
    parts = key.split(".")
    for i in range(len(parts)):
        yield (".".join(parts[:i]) + "." if i else ""), ".".join(parts[i:])


def _sample(keys: Sequence[str]) -> Sequence[str]:
    if len(keys) <= _MAX_SAMPLED_KEYS:
        return keys
    step = len(keys) / _MAX_SAMPLED_KEYS
    return [keys[int(i * step)] for i in range(_MAX_SAMPLED_KEYS)]


def prefix_pairs(source_keys: Sequence[str], target_keys: Sequence[str]) -> list[tuple[str, str]]:
    """(source prefix, target prefix) pairs that turn source keys into target keys, most supported first.

    Found from the data: a source key ``pa + s`` and a target key ``pb + s``
    share the suffix ``s``; suffixes that many prefixes share are ignored.
    """
    index: dict[str, set[str]] = {}
    for key in _sample(target_keys):
        for prefix, rest in _prefixes_of(key):
            index.setdefault(rest, set()).add(prefix)
    counts: Counter[tuple[str, str]] = Counter()
    for key in _sample(source_keys):
        seen: set[tuple[str, str]] = set()
        for prefix, rest in _prefixes_of(key):
            heads = index.get(rest)
            if not heads or len(heads) > _MAX_PREFIXES_PER_SUFFIX:
                continue
            for head in heads:
                if head != prefix and (prefix, head) not in seen:
                    seen.add((prefix, head))
                    counts[(prefix, head)] += 1
    return [pair for pair, _ in counts.most_common(_MAX_DATA_CANDIDATES)]


def _prefix_candidates(source_keys: Sequence[str], target_keys: Sequence[str],
                       target_prefixes: Sequence[str]) -> list[RuleSet]:
    strips = [p for p in WRAPPER_PREFIXES if any(k.startswith(p) for k in source_keys)]
    strips += [p for p in detect_prefixes(source_keys) if p not in strips]
    adds = [p for p in WRAPPER_PREFIXES if any(k.startswith(p) for k in target_keys)]
    adds += [p for p in list(target_prefixes) + detect_prefixes(target_keys) if p and p not in adds]
    out: list[RuleSet] = [RuleSet(strip_prefix=(p,)) for p in strips]
    out += [RuleSet(add_prefix=p) for p in adds]
    out += [RuleSet(strip_prefix=(s,), add_prefix=a) for s in strips for a in adds if s != a]
    for pa, pb in prefix_pairs(source_keys, target_keys):
        if pa and pb:
            out.append(RuleSet(strip_prefix=(pa,), add_prefix=pb))
            out.append(RuleSet(rename=((re.escape(pa) + "(.*)", _escape_repl(pb) + r"\1"),)))
        elif pa:
            out.append(RuleSet(strip_prefix=(pa,)))
        else:
            out.append(RuleSet(add_prefix=pb))
    unique: list[RuleSet] = []
    for r in out:
        if r not in unique:
            unique.append(r)
    return unique


def _escape_repl(text: str) -> str:
    return text.replace("\\", "\\\\")


def _component_rule(prefix: Sequence[str], old: str, new: str, tail: bool) -> tuple[str, str]:
    """A whole-key regex that renames one path component after ``prefix`` (layer indices generalised)."""
    pattern: list[str] = []
    repl: list[str] = []
    group = 0
    for part in prefix:
        if part.isdigit():
            group += 1
            pattern.append(r"(\d+)")
            repl.append(f"\\{group}")
        else:
            pattern.append(re.escape(part))
            repl.append(_escape_repl(part))
    pattern.append(re.escape(old))
    repl.append(_escape_repl(new))
    pat, rep = r"\.".join(pattern), ".".join(repl)
    if tail:
        group += 1
        pat += r"\.(.*)"
        rep += f".\\{group}"
    return pat, rep


def _rename_candidates(unmatched: Sequence[tuple[str, TensorMeta]],
                       missing: Mapping[str, tuple[int, ...]]) -> list[tuple[str, str]]:
    """Renames of one path component (or of a leading path) seen between unmatched and missing keys."""
    buckets: dict[tuple[int, tuple[int, ...]], list[list[str]]] = {}
    for key, shape in missing.items():
        parts = key.split(".")
        buckets.setdefault((len(parts), shape), []).append(parts)
    counts: Counter[tuple[str, str]] = Counter()
    pairs = 0
    for key, t in unmatched:
        parts = key.split(".")
        for other in buckets.get((len(parts), t.shape), ()):
            pairs += 1
            if pairs > _MAX_RENAME_PAIRS:
                break
            diff = [i for i, (x, y) in enumerate(zip(parts, other)) if x != y]
            if len(diff) != 1:
                continue
            i = diff[0]
            if parts[i].isdigit() and other[i].isdigit():
                continue  # a shifted layer index is not a rename
            counts[_component_rule(parts[:i], parts[i], other[i], i < len(parts) - 1)] += 1
    # a module moved under (or out of) a parent: encoder.* -> backbone.encoder.*
    moved = prefix_pairs([k for k, _ in unmatched], list(missing))
    for pa, pb in moved:
        for key, _ in unmatched:
            if key.startswith(pa):
                head = key[len(pa):].split(".", 1)[0]
                rule = (re.escape(pa + head) + r"\.(.*)", _escape_repl(pb + head) + r".\1")
                counts[rule] += 1
    return [rule for rule, _ in counts.most_common(24)]


# ------------------------------------------------------------------ the search


def _ambiguous(ranked: Sequence[_Score]) -> bool:
    """Two rewrites remove as many differences but send keys to different places: no guess."""
    top = [s for s in ranked if s.differences == ranked[0].differences]
    return any(s.landed != top[0].landed for s in top[1:])


def suggest(source: Sequence[TensorMeta], target: Sequence[TensorMeta], *,
            target_prefixes: Sequence[str] = (), lazy: Iterable[str] = ()) -> Suggestion | None:
    """The best key rewrite of ``source`` towards ``target``, or None when nothing helps.

    Prefix rewrites are tried first; then, on what is still unmatched,
    shape-preserving renames are added one at a time while each removes
    differences and no other rename would do equally well (unique).
    """
    scorer = _Scorer(source, target, lazy)
    source_keys = [t.key for t in source]
    target_keys = [t.key for t in target]
    base = scorer.score(RuleSet())
    if base is None or base.differences == 0:
        return None
    best_rules, best = RuleSet(), base
    improving = []
    for rules in scorer.shortlist(_prefix_candidates(source_keys, target_keys, target_prefixes)):
        score = scorer.score(rules)
        if score is not None and score.differences < base.differences:
            improving.append((_rank(score, rules), rules, score))
    improving.sort(key=lambda x: x[0])
    if improving and not _ambiguous([x[2] for x in improving]):
        _, best_rules, best = improving[0]
    for _ in range(_MAX_RENAMES):
        if best.differences == 0:
            break
        unmatched, missing = scorer.residual(best_rules)
        if not unmatched or not missing:
            break
        ranked = []
        by_rules = {best_rules.then(RuleSet(rename=(rule,))): rule for rule in _rename_candidates(unmatched, missing)}
        for rules in scorer.shortlist(list(by_rules)):
            rule = by_rules[rules]
            score = scorer.score(rules)
            if score is not None and score.differences < best.differences and score.shape_bad <= best.shape_bad:
                ranked.append((score.differences, rule, rules, score))
        if not ranked:
            break
        ranked.sort(key=lambda x: (x[0], len(x[1][0])))
        if _ambiguous([x[3] for x in ranked]):
            break
        _, _, best_rules, best = ranked[0]
    if best_rules.is_empty:
        return None
    if not scorer.agrees_with_migrate(best_rules):
        return None  # migrate would not do what was scored: never print a command that misleads
    reconciled = len(best.matched - base.matched)
    return Suggestion(best_rules, reconciled, best.missing, best.unexpected, best.shape_bad, best.renamed)
