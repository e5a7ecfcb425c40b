"""How tensor-parallel shards merge: the rules a run records, or a rules file the user gives.

ckpt keeps no per-model table of split dimensions. The rules come from one
of two places:

- ``universal_checkpoint_info`` in the model states (Megatron-DeepSpeed and
  AutoTP record it for DeepSpeed's ds_to_universal): regexes matched with
  ``re.match`` as ds_to_universal does; a parameter no pattern names is
  concatenated along dim 0, as there;
- a TOML rules file (``ckpt migrate --tp-rules FILE``): glob patterns over
  the full key (``fnmatch``); the ``replicated`` patterns first, then the
  ``[[tp]]`` tables in file order; the first that matches decides, and a key
  that none matches is an error::

      replicated = ["*.input_layernorm.*", "*.dense_4h_to_h.bias"]

      [[tp]]
      pattern = "*.dense_h_to_4h.*"
      dim = 0

      [vocab]                       # optional: cut the padded vocabulary rows
      pattern = "*.word_embeddings.weight"
      size = 50257

Parsing needs only tomllib (tomli on Python 3.10, as keys/rules.py); nothing here reads tensors.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import UsageError
from ...format_names import TpMerge

UC_INFO = "universal_checkpoint_info"


@dataclass(frozen=True)
class TpRule:
    """What one pattern says: merge kind and, for CONCAT, the dimension."""

    pattern: str
    merge: TpMerge
    dim: int = 0


@dataclass(frozen=True)
class TpRules:
    """An ordered rule list; ``regex`` selects DeepSpeed's ``re.match`` over fnmatch globs."""

    rules: tuple[TpRule, ...]
    origin: str  # the rules file, or UC_INFO
    regex: bool = False
    default: TpRule | None = None  # applied when no rule matches (DeepSpeed: concatenate along dim 0)
    vocab_patterns: tuple[str, ...] = ()
    vocab_size: int | None = None
    unsupported: tuple[tuple[str, str], ...] = ()  # (pattern, why ckpt cannot merge what it matches)

    def _matches(self, pattern: str, key: str) -> bool:
        return re.match(pattern, key) is not None if self.regex else fnmatch.fnmatchcase(key, pattern)

    def rule_for(self, key: str) -> TpRule | None:
        for rule in self.rules:
            if self._matches(rule.pattern, key):
                return rule
        return self.default

    def unsupported_for(self, key: str) -> str | None:
        for pattern, why in self.unsupported:
            if self._matches(pattern, key):
                return why
        return None

    def vocab_rows(self, key: str) -> int | None:
        """The real vocabulary size when ``key`` is a padded vocabulary tensor to cut."""
        if self.vocab_size is not None and any(self._matches(p, key) for p in self.vocab_patterns):
            return self.vocab_size
        return None


def _strings(value: object, what: str, origin: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{what} must be a list of patterns (strings)", origin)
    return tuple(value)


def parse_rules(text: str, origin: str) -> TpRules:
    """A TOML rules file's text as TpRules (UsageError, naming the file, for anything malformed)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"not a TOML rules file: {exc}", origin) from None
    unknown = sorted(set(doc) - {"replicated", "tp", "vocab"})
    if unknown:
        raise UsageError(f"unknown entries {', '.join(map(repr, unknown))} (a tensor-parallel rules file has "
                         "'replicated', [[tp]] tables and an optional [vocab] table)", origin)
    rules = [TpRule(p, TpMerge.REPLICATED) for p in _strings(doc.get("replicated"), "replicated", origin)]
    tables = doc.get("tp", [])
    if not isinstance(tables, list):
        raise UsageError("'tp' must be an array of tables ([[tp]] with pattern and dim)", origin)
    for i, table in enumerate(tables):
        if not isinstance(table, Mapping) or set(table) - {"pattern", "dim"}:
            raise UsageError(f"[[tp]] table {i + 1} must hold only 'pattern' and 'dim'", origin)
        pattern, dim = table.get("pattern"), table.get("dim")
        if not isinstance(pattern, str) or not pattern:
            raise UsageError(f"[[tp]] table {i + 1} has no 'pattern' string", origin)
        if type(dim) is not int or dim < 0:
            raise UsageError(f"[[tp]] table {i + 1} ({pattern!r}) needs 'dim', a dimension index >= 0", origin)
        rules.append(TpRule(pattern, TpMerge.CONCAT, dim))
    vocab = doc.get("vocab")
    patterns: tuple[str, ...] = ()
    size = None
    if vocab is not None:
        if not isinstance(vocab, Mapping) or set(vocab) - {"pattern", "size"}:
            raise UsageError("[vocab] must hold 'pattern' (or a list of them) and 'size'", origin)
        raw = vocab.get("pattern")
        patterns = (raw,) if isinstance(raw, str) else _strings(raw, "[vocab] pattern", origin)
        size = vocab.get("size")
        if not patterns or type(size) is not int or size < 1:
            raise UsageError("[vocab] needs 'pattern' and 'size', the vocabulary size without padding", origin)
    if not rules:
        raise UsageError("the rules file names no pattern ('replicated' or [[tp]] tables)", origin)
    return TpRules(tuple(rules), origin, vocab_patterns=patterns, vocab_size=size)


def load_rules(path: str) -> TpRules:
    """Read a TOML rules file (``--tp-rules FILE``)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise UsageError(f"cannot read the tensor-parallel rules file: {exc.strerror}", path) from None
    return parse_rules(text, path)


def from_universal_info(info: Mapping[Any, Any]) -> TpRules:
    """The rules DeepSpeed's ds_to_universal applies (deepspeed/checkpoint/ds_to_universal.py merge_tp_slices)."""
    def pats(name: str) -> tuple[str, ...]:
        value = info.get(name)
        return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()

    rules = [TpRule(p, TpMerge.REPLICATED) for p in pats("tp_replicated_parameter_patterns")]
    rules += [TpRule(p, TpMerge.TWO_SUB_PARAMS) for p in pats("parameter_with_2_sub_params_cat_dim_0")]
    rules += [TpRule(p, TpMerge.CONCAT, 1) for p in pats("parameter_with_row_parallelism_patterns")]
    unsupported = [(p, "it is averaged over the ranks (parameter_to_average_patterns); ckpt copies bytes and does "
                    "not compute") for p in pats("parameter_to_average_patterns")]
    subs = info.get("parameter_with_sub_params")
    for entry in subs if isinstance(subs, list) else []:
        for p in (entry.get("patterns") or []) if isinstance(entry, Mapping) else []:
            unsupported.append((str(p), "it is made of sub-parameters (parameter_with_sub_params), which ckpt "
                                "does not merge yet"))
    # AutoTP publishes an affine map beside the category patterns, "so a converter that predates the map
    # simply does not see the key and takes the categories" (deepspeed/module_inject/layers.py): ckpt is such
    # a converter. What AutoTP itself cannot describe it lists as unsupported, with its reason.
    autotp = info.get("autotp_unsupported_parameter_patterns")
    for p, reason in autotp.items() if isinstance(autotp, Mapping) else ():
        unsupported.append((str(p), f"AutoTP records it as not convertible ({reason})"))
    size = info.get("original_vocab_size")
    return TpRules(tuple(rules), UC_INFO, regex=True, default=TpRule("", TpMerge.CONCAT, 0),
                   vocab_patterns=pats("vocabulary_parameter_patterns"),
                   vocab_size=size if type(size) is int and size > 0 else None, unsupported=tuple(unsupported))
