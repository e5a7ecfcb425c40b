"""Infer the key rewrite that makes one key set load into another.

Candidate rules (wrapper prefixes, prefixes found by matching key suffixes,
shape-preserving renames of one path component: candidates.py) are each
applied to the source keys and scored against the target's keys and shapes
(scoring.py); the best rule that removes differences wins. Pure metadata:
no torch, no tensor bytes.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import TensorMeta
from .candidates import prefix_candidates, rename_candidates
from .inserts import head_drop
from .rules import RuleSet
from .scoring import Score, Scorer, rank

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
    dropped: int = 0  # source keys a --drop rule leaves out (an extra head the target lacks)

    @property
    def complete(self) -> bool:
        """True when the rewrite leaves no key difference at all."""
        return not (self.remaining_missing or self.remaining_unexpected or self.remaining_shape_mismatch)

    def command(self, source: str, output: str | None = None, *, key: str | None = None,
                target: str | None = None, target_kwargs: str | None = None) -> str:
        """The exact ``ckpt migrate`` command that applies the rewrite (shell-quoted)."""
        out, to = (output, []) if output is not None else default_output(source)
        args = ["ckpt", "migrate", source, "-o", out, *to]
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
                "drop": list(r.drop),
            },
            "options": r.cli_args(),
            "reconciled": self.reconciled,
            "renamed": self.renamed,
            "dropped": self.dropped,
            "remaining_missing": self.remaining_missing,
            "remaining_unexpected": self.remaining_unexpected,
            "remaining_shape_mismatch": self.remaining_shape_mismatch,
            "complete": self.complete,
        }


def default_output(source: str) -> tuple[str, list[str]]:
    """Where the suggested migrate writes, and the ``--to`` that output needs.

    ``model.pth`` -> ``model.fixed.pth``; a library's folder (save_pretrained, a Trainer run, a PEFT
    adapter) -> ``folder.fixed`` written ``--to hf``, a folder of the same library; any other folder or
    set (sharded, DCP, DeepSpeed) -> one ``folder.fixed.safetensors`` file.
    """
    from ..formats.hf import is_library_folder

    path = source.rstrip("/\\") or source
    if os.path.isdir(path):
        return (path + ".fixed", ["--to", "hf"]) if is_library_folder(path) else (path + ".fixed.safetensors", [])
    stem, ext = os.path.splitext(path)
    if ext == ".json" and stem.endswith(".index"):  # model.safetensors.index.json: a sharded set
        folder = os.path.dirname(path)
        return (folder + ".fixed.safetensors" if folder else "model.fixed.safetensors"), []
    return (f"{stem}.fixed{ext}" if ext else f"{path}.fixed.pth"), []  # no extension: migrate needs one


def _ambiguous(ranked: Sequence[Score]) -> bool:
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
    scorer = Scorer(source, target, lazy)
    source_keys = [t.key for t in source]
    target_keys = [t.key for t in target]
    base = scorer.score(RuleSet())
    if base is None or base.differences == 0:
        return None
    best_rules, best = RuleSet(), base
    improving = []
    for rules in scorer.shortlist(prefix_candidates(source_keys, target_keys, target_prefixes)):
        score = scorer.score(rules)
        if score is not None and score.differences < base.differences:
            improving.append((rank(score, rules), rules, score))
    improving.sort(key=lambda x: x[0])
    if improving and not _ambiguous([x[2] for x in improving]):
        _, best_rules, best = improving[0]
    best_rules, best = _add_renames(scorer, best_rules, best)
    if not best_rules.is_empty and not scorer.agrees_with_migrate(best_rules):
        return None  # migrate would not do what was scored: never print a command that misleads
    reconciled = len(best.matched - base.matched)
    if best.unexpected and not best.missing and not best.shape_bad:
        dropped = _drop_head(scorer, best_rules, source)
        if dropped is not None:
            return Suggestion(dropped[0], reconciled, 0, 0, 0, best.renamed, dropped=dropped[1])
    if best_rules.is_empty:
        return None
    return Suggestion(best_rules, reconciled, best.missing, best.unexpected, best.shape_bad, best.renamed)


def _add_renames(scorer: Scorer, best_rules: RuleSet, best: Score) -> tuple[RuleSet, Score]:
    """``best_rules`` with shape-preserving renames added one at a time while each removes differences and no
    other rename would do equally well; with the score of the result."""
    for _ in range(_MAX_RENAMES):
        if best.differences == 0:
            break
        unmatched, missing = scorer.residual(best_rules)
        if not unmatched or not missing:
            break
        ranked = []
        by_rules = {best_rules.then(RuleSet(rename=(rule,))): rule for rule in rename_candidates(unmatched, missing)}
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
    return best_rules, best


def _drop_head(scorer: Scorer, rules: RuleSet, source: Sequence[TensorMeta]) -> tuple[RuleSet, int] | None:
    """``rules`` plus ``--drop 'HEAD.*'`` when only an extra head is left over, checked with migrate's new_key."""
    unmatched, _ = scorer.residual(rules)
    left = {out for out, _ in unmatched}
    glob = head_drop(left, [out for out in (scorer.outputs(rules) or ()) if out not in left])
    if glob is None:
        return None
    with_drop = rules.then(RuleSet(drop=(glob,)))
    gone = [t.key for t in source if with_drop.new_key(t.key) is None]
    return (with_drop, len(gone)) if len(gone) == len(left) else None
