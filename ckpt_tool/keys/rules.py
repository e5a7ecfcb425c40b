"""Key rewriting: the rules that remove the prefixes people's checkpoints carry (prefixes.py finds them)."""
from __future__ import annotations

import fnmatch
import functools
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import dtypes
from ..errors import RuleConflict, UsageError
from ..model import TensorMeta


@dataclass(frozen=True)
class RuleSet:
    """Key rewrites applied in a fixed order: strip, add, rename, drop, cast.

    ``rename`` patterns match whole keys (``re.fullmatch``); the replacement
    may use groups (``\\1``). ``drop`` entries are shell globs on the
    rewritten key. ``dtype`` casts floating tensors only; ``casts`` maps a
    glob to a dtype for specific keys (a non-floating match is a conflict).
    """

    strip_prefix: tuple[str, ...] = ()
    add_prefix: str | None = None
    rename: tuple[tuple[str, str], ...] = ()
    drop: tuple[str, ...] = ()
    dtype: str | None = None
    casts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for pattern, _ in self.rename:
            try:
                re.compile(rf"\A(?:{pattern})\Z")  # the anchored form new_key uses
            except re.error as exc:
                raise UsageError(f"--rename {pattern!r}: invalid regular expression ({exc})") from None
        for name in [self.dtype] + [d for _, d in self.casts]:
            if name is not None and not dtypes.is_known(name):
                raise UsageError(f"unknown dtype {name!r}")
        if self.dtype is not None and not dtypes.lookup(self.dtype).is_floating:
            raise UsageError(f"--dtype {self.dtype}: only floating dtypes can be cast to")
        for name in [self.dtype] + [d for _, d in self.casts]:
            found = dtypes.lookup(name) if name is not None else None
            if found is not None and found.is_floating and found.name not in dtypes.CAST_CHECKED:
                raise UsageError(f"a cast to {found.name}: ckpt cannot yet prove that such a cast keeps the values "
                                 f"(it checks {', '.join(sorted(dtypes.CAST_CHECKED))}); nothing was written")

    @property
    def is_empty(self) -> bool:
        return not (self.strip_prefix or self.add_prefix or self.rename or self.drop or self.dtype or self.casts)

    def new_key(self, key: str) -> str | None:
        """The output key for ``key``, or None if a drop rule removes it."""
        for p in self.strip_prefix:
            if key.startswith(p):
                key = key[len(p):]
        if self.add_prefix:
            key = self.add_prefix + key
        if self.rename:
            for rx, repl in _compiled_renames(self.rename):
                try:
                    key = rx.sub(repl, key, count=1)
                except (re.error, IndexError) as exc:  # a bad group reference shows only on a match
                    raise UsageError(f"--rename {rx.pattern[5:-3]}={repl}: invalid replacement ({exc})") from None
        if self.drop and _compiled_globs(self.drop).match(key):
            return None
        return key

    def cast_for(self, key: str, t: TensorMeta) -> str | None:
        if self.dtype is None and not self.casts:
            return None
        for glob, dt in self.casts:
            if fnmatch.fnmatchcase(key, glob):
                return dtypes.lookup(dt).name
        if self.dtype is not None and t.is_floating:
            return dtypes.lookup(self.dtype).name
        return None

    def cli_args(self) -> list[str]:
        """The migrate options that express these rules."""
        args: list[str] = []
        for p in self.strip_prefix:
            args += ["--strip-prefix", p]
        if self.add_prefix:
            args += ["--add-prefix", self.add_prefix]
        for pattern, repl in self.rename:
            args += ["--rename", f"{pattern}={repl}"]
        for glob in self.drop:
            args += ["--drop", glob]
        if self.dtype:
            args += ["--dtype", self.dtype]
        return args

    def describe(self) -> str:
        """The rules as options (per-key casts, which only a rules file holds, in brackets)."""
        text = " ".join(shlex.quote(a) for a in self.cli_args())
        if self.casts:
            text += (" " if text else "") + "[cast " + ", ".join(f"{g}={d}" for g, d in self.casts) + "]"
        return text or "(no rules)"

    def then(self, other: RuleSet) -> RuleSet:
        """These rules followed by ``other``'s (used to merge CLI options over a rules file)."""
        return RuleSet(
            strip_prefix=self.strip_prefix + other.strip_prefix,
            add_prefix=other.add_prefix or self.add_prefix,
            rename=self.rename + other.rename,
            drop=self.drop + other.drop,
            dtype=other.dtype or self.dtype,
            casts=self.casts + other.casts,
        )


@functools.lru_cache(maxsize=64)
def _compiled_renames(rename: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    # Anchored at both ends, ``sub`` is fullmatch + expand, and unlike
    # Match.expand it caches the parsed replacement (3x faster per key).
    return tuple((re.compile(rf"\A(?:{p})\Z"), r) for p, r in rename)


@functools.lru_cache(maxsize=64)
def _compiled_globs(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One regex for several shell globs (fnmatch.translate anchors each)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))


def parse_rename(spec: str) -> tuple[str, str]:
    """``'REGEX=REPLACEMENT'`` split at the last ``=`` that is not escaped."""
    pos = len(spec)
    while True:
        pos = spec.rfind("=", 0, pos)
        if pos <= 0:
            raise UsageError(f"--rename {spec!r}: expected 'REGEX=REPLACEMENT'")
        if spec[pos - 1] != "\\":
            return spec[:pos], spec[pos + 1:]


class PlanEntry(NamedTuple):
    """One source key's fate (a NamedTuple: a plan holds one per tensor, 200,000 in some files)."""

    source: str
    output: str | None  # None: dropped
    dtype: str  # dtype in the source
    cast: str | None  # dtype in the output, when it changes


@dataclass(frozen=True)
class Plan:
    entries: tuple[PlanEntry, ...]
    rules: RuleSet = field(default_factory=RuleSet)

    @property
    def renamed(self) -> list[tuple[str, str]]:
        return [(e.source, e.output) for e in self.entries if e.output is not None and e.output != e.source]

    @property
    def dropped(self) -> list[str]:
        return [e.source for e in self.entries if e.output is None]

    @property
    def kept(self) -> list[PlanEntry]:
        return [e for e in self.entries if e.output is not None]

    def mapping(self) -> dict[str, str]:
        return {e.source: e.output for e in self.entries if e.output is not None}


def make_plan(tensors: Sequence[TensorMeta], rules: RuleSet) -> Plan:
    """Apply ``rules`` to every key; every conflict is raised before anything is written."""
    entries = []
    seen: dict[str, str] = {}
    new_key = rules.new_key
    for t in tensors:
        out = new_key(t.key)
        if out is not None:
            if out == "":
                raise RuleConflict(f"the rules turn {t.key!r} into an empty key")
            if out in seen:
                raise RuleConflict(f"{seen[out]!r} and {t.key!r} would both become {out!r}")
            seen[out] = t.key
        cast = rules.cast_for(out or t.key, t) if out is not None else None
        if cast is not None and not t.is_floating:
            raise RuleConflict(f"cannot cast {t.key!r} ({t.dtype}) to {cast}: only floating tensors are cast")
        if cast == t.dtype:
            cast = None
        if cast is not None and t.dtype not in dtypes.CAST_CHECKED:  # float8_e8m0fnu, float4_e2m1fn_x2
            raise RuleConflict(f"cannot cast {t.key!r} ({t.dtype}) to {cast}: ckpt cannot yet prove that a cast from "
                               f"{t.dtype} keeps the values (it checks {', '.join(sorted(dtypes.CAST_CHECKED))}); "
                               "cast only the other tensors, by name, with a rules file [cast] entry")
        entries.append(PlanEntry(t.key, out, t.dtype, cast))
    return Plan(tuple(entries), rules)


def load_rules_file(path: str) -> RuleSet:
    """A RuleSet from TOML (see docs/migrate.md for the format)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            doc: Mapping[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read rules file: {exc.strerror}", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"invalid TOML in rules file: {exc}", path) from None
    known = {"strip_prefix", "add_prefix", "rename", "drop", "dtype", "cast"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise UsageError(f"unknown keys in rules file: {', '.join(unknown)} (known: {', '.join(sorted(known))})", path)

    def str_list(name: str) -> tuple[str, ...]:
        value = doc.get(name, [])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"rules file: {name} must be a string or a list of strings", path)
        return tuple(value)

    pairs = _rename_pairs(doc.get("rename", []), path)
    cast = doc.get("cast", {})
    if not isinstance(cast, dict):
        raise UsageError("rules file: cast must be a table of glob = dtype", path)
    add = doc.get("add_prefix")
    if add is not None and not isinstance(add, str):
        raise UsageError("rules file: add_prefix must be a string", path)
    dt = doc.get("dtype")
    if dt is not None and not isinstance(dt, str):
        raise UsageError("rules file: dtype must be a string", path)
    return RuleSet(str_list("strip_prefix"), add or None, pairs, str_list("drop"), dt,
                   tuple((str(k), str(v)) for k, v in cast.items()))


def _rename_pairs(rename: object, path: str) -> tuple[tuple[str, str], ...]:
    """A rules file's ``rename``: a table of REGEX = REPLACEMENT, or a list of 'REGEX=REPLACEMENT' strings and
    {pattern, replacement} tables, in order."""
    if isinstance(rename, dict):
        return tuple((str(k), str(v)) for k, v in rename.items())
    pairs: list[tuple[str, str]] = []
    if isinstance(rename, list):
        for item in rename:
            if isinstance(item, str):
                pairs.append(parse_rename(item))
            elif isinstance(item, dict) and {"pattern", "replacement"} <= set(item):
                pairs.append((str(item["pattern"]), str(item["replacement"])))
            else:
                raise UsageError("rules file: rename entries are 'REGEX=REPLACEMENT' or {pattern, replacement}", path)
    return tuple(pairs)
