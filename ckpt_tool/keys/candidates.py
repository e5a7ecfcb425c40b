"""Candidate key rewrites worth scoring, found from the two key sets.

Wrapper prefixes (DDP ``module.``, ``_orig_mod.``, ...), prefix pairs found
by matching key suffixes, and renames of one path component (layer indices
generalised) between keys that are still unmatched.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from ..model import TensorMeta
from .inserts import insertion_candidates
from .prefixes import KNOWN_PREFIXES, detect_prefixes
from .rules import RuleSet
from .scoring import sample

# Wrapper prefixes tried on both sides, most specific first.
WRAPPER_PREFIXES = KNOWN_PREFIXES
# A key suffix shared by more prefixes than this is ambiguous (``weight``) and not used for matching.
_MAX_PREFIXES_PER_SUFFIX = 3
_MAX_DATA_CANDIDATES = 12
_MAX_RENAME_PAIRS = 200_000


def _prefixes_of(key: str) -> Iterable[tuple[str, str]]:
    """Every (dotted prefix, rest) split of a key; the prefix ends with a dot or is empty."""
    parts = key.split(".")
    for i in range(len(parts)):
        yield (".".join(parts[:i]) + "." if i else ""), ".".join(parts[i:])


def prefix_pairs(source_keys: Sequence[str], target_keys: Sequence[str]) -> list[tuple[str, str]]:
    """(source prefix, target prefix) pairs that turn source keys into target keys, most supported first.

    Found from the data: a source key ``pa + s`` and a target key ``pb + s``
    share the suffix ``s``; suffixes that many prefixes share are ignored.
    """
    index: dict[str, set[str]] = {}
    for key in sample(target_keys):
        for prefix, rest in _prefixes_of(key):
            index.setdefault(rest, set()).add(prefix)
    counts: Counter[tuple[str, str]] = Counter()
    for key in sample(source_keys):
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


def prefix_candidates(source_keys: Sequence[str], target_keys: Sequence[str],
                       target_prefixes: Sequence[str]) -> list[RuleSet]:
    """Prefix rewrites (strip, add, or both) suggested by wrappers, common prefixes and shared suffixes."""
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


def rename_candidates(unmatched: Sequence[tuple[str, TensorMeta]],
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
            diff = [i for i, (x, y) in enumerate(zip(parts, other, strict=False)) if x != y]
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
    counts.update(insertion_candidates(unmatched, missing))  # an adapter name inserted (PEFT's ``default``)
    return [rule for rule, _ in counts.most_common(24)]
