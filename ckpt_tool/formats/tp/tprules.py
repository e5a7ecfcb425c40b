"""How tensor-parallel shards merge: the rules a run records, or a rules file the user gives.

ckpt keeps no per-model table of split dimensions. The rules come from one
of two places:

- ``universal_checkpoint_info`` in the model states (Megatron-DeepSpeed and
  AutoTP record it for DeepSpeed's ds_to_universal): regexes matched with
  ``re.match`` as ds_to_universal does; a parameter no pattern names is
  concatenated along dim 0, as there. AutoTP (version 0.4) adds an
  ``affine_map``, which places every block of every parameter it names and
  so decides before any category, and ``sub_param_shard_widths`` for fused
  sub-parameters;
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
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError, UsageError
from ...format_names import TpMerge

UC_INFO = "universal_checkpoint_info"


@dataclass(frozen=True)
class TpRule:
    """What one pattern says: merge kind and, for CONCAT, the dimension."""

    pattern: str
    merge: TpMerge
    dim: int = 0


@dataclass(frozen=True)
class AffinePiece:
    """A block of the whole tensor a rank holds (DeepSpeed's deepspeed/checkpoint/affine.py): the same ``shape``
    viewed with ``torch.as_strided`` arguments in the whole tensor (``source``) and in the rank's flat shard
    (``dest``); ``locations`` every rank that holds it."""

    shape: tuple[int, ...]
    source: tuple[int, tuple[int, ...]]
    dest: tuple[int, tuple[int, ...]]
    locations: tuple[int, ...]
    scale: float = 1.0  # the rank holds the block times this (a pre-divided bias); ckpt merges only 1.0


@dataclass(frozen=True)
class AffineMap:
    """Where every element of one parameter lives on the tensor-parallel ranks: ``ranks[r]`` is rank r's
    (shard shape, pieces). It supersedes the pattern categories, as in ds_to_universal."""

    pattern: str
    logical_shape: tuple[int, ...]
    ranks: tuple[tuple[tuple[int, ...], tuple[AffinePiece, ...]], ...]


@dataclass(frozen=True)
class SubParams:
    """A fused parameter (``parameter_with_sub_params``): sub-parameters one after another along ``dim``, each
    split over the ranks; ``widths[i][r]`` is rank r's share of sub-parameter i (``sub_param_shard_widths``).
    Without widths (universal checkpoint < 0.4) the split was even: ``count`` equal sub-parameters, or ``sizes``."""

    pattern: str
    dim: int
    ndim: int  # of the recorded view; one that reshapes the tensor (MoE's (experts, -1, hidden)) is not merged
    sizes: tuple[int, ...] | None
    count: int | None
    widths: tuple[tuple[int, ...], ...] | None


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
    affine: tuple[AffineMap, ...] = ()  # AutoTP's affine_map: one per parameter pattern, matched first
    sub_params: tuple[SubParams, ...] = ()  # what a TpMerge.SUB_PARAMS rule's pattern records
    _affine_by_name: Mapping[str, AffineMap] = field(init=False, repr=False, compare=False)
    _affine_other: tuple[AffineMap, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, AffineMap] = {}
        other: list[AffineMap] = []
        for m in self.affine:
            name = _literal(m.pattern) if self.regex else None
            if name is None or name in by_name:
                other.append(m)
            else:
                by_name[name] = m
        object.__setattr__(self, "_affine_by_name", by_name)
        object.__setattr__(self, "_affine_other", tuple(other))

    def _matches(self, pattern: str, key: str) -> bool:
        return re.match(pattern, key) is not None if self.regex else fnmatch.fnmatchcase(key, pattern)

    def rule_for(self, key: str) -> TpRule | None:
        for rule in self.rules:
            if self._matches(rule.pattern, key):
                return rule
        return self.default

    def affine_for(self, key: str, path: str = "") -> AffineMap | None:
        """The affine map whose pattern matches ``key`` (DeepSpeed refuses two; so does ckpt).

        AutoTP writes one ``^<escaped name>$`` pattern per parameter: those are looked up by name, so a model
        of thousands of parameters is not thousands of regexes per key; any other pattern is matched."""
        named = self._affine_by_name.get(key)
        found = ([named] if named is not None else []) + [m for m in self._affine_other
                                                          if self._matches(m.pattern, key)]
        if len(found) > 1:
            raise InputError(f"two affine_map patterns match {key!r} ('{found[0].pattern}', '{found[1].pattern}') "
                             f"in the run's {UC_INFO}: which one places its shards is ambiguous", path or self.origin)
        return found[0] if found else None

    def sub_params_for(self, pattern: str) -> SubParams | None:
        return next((p for p in self.sub_params if p.pattern == pattern), None)

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


def _literal(pattern: str) -> str | None:
    """The name a ``^<re.escape(name)>$`` pattern matches, and only it; None for any other pattern."""
    if not (pattern.startswith("^") and pattern.endswith("$")) or pattern.endswith("\\$"):
        return None
    inner = pattern[1:-1]
    name = re.sub(r"\\(.)", r"\1", inner)
    return name if re.escape(name) == inner else None


AFFINE_VERSION = 1  # the affine_map encoding ckpt reads (DeepSpeed 0.19.8's AFFINE_MAP_FORMAT_VERSION)


def _ints(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list | tuple) and all(type(v) is int for v in value):
        return tuple(value)
    return None


def _view(value: object) -> tuple[int, tuple[int, ...]] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and type(value[0]) is int:
        strides = _ints(value[1])
        if strides is not None:
            return value[0], strides
    return None


def _affine_map(pattern: str, entry: object, path: str) -> AffineMap:
    """One parameter's map, checked for form (coverage and scaling are checked by tpmerge, per tensor)."""
    bad = f"the affine_map entry for '{pattern}' in the run's {UC_INFO} is malformed"
    shape = _ints(entry.get("logical_shape")) if isinstance(entry, Mapping) else None
    ranks = entry.get("ranks") if isinstance(entry, Mapping) else None
    if shape is None or not isinstance(ranks, Mapping) or not ranks:
        raise InputError(f"{bad} (it needs 'logical_shape' and 'ranks')", path)
    ranks = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in ranks.items()}  # JSON-keyed too
    if sorted(ranks, key=str) != sorted(range(len(ranks)), key=str):
        raise InputError(f"{bad}: its ranks are {sorted(map(str, ranks))}, not 0..{len(ranks) - 1}", path)
    out = []
    for r in range(len(ranks)):
        value = ranks[r]
        shard = _ints(value.get("shard_shape")) if isinstance(value, Mapping) else None
        raw = value.get("pieces") if isinstance(value, Mapping) else None
        if shard is None or not isinstance(raw, list):
            raise InputError(f"{bad} (rank {r} needs 'shard_shape' and 'pieces')", path)
        pieces = []
        for p in raw:
            if not isinstance(p, Mapping):
                raise InputError(f"{bad} (a piece of rank {r} is not a table)", path)
            pshape, source, dest, where = _ints(p.get("shape")), _view(p.get("source")), _view(p.get("dest")), \
                _ints(p.get("locations"))
            if pshape is None or source is None or dest is None or where is None or r not in where \
                    or len(source[1]) != len(pshape) or len(dest[1]) != len(pshape) or min(pshape, default=1) < 0:
                raise InputError(f"{bad} (a piece of rank {r}: {dict(p)!r})", path)
            scale = p.get("scale", 1.0)
            if type(scale) not in (int, float) or not scale:
                raise InputError(f"{bad} (a piece of rank {r} has the scale {scale!r})", path)
            pieces.append(AffinePiece(pshape, source, dest, tuple(sorted(where)), float(scale)))
        out.append((shard, tuple(pieces)))
    return AffineMap(pattern, shape, tuple(out))


def _sub_params(info: Mapping[Any, Any], path: str) -> list[SubParams]:
    """``parameter_with_sub_params`` with ``sub_param_shard_widths``, read as ds_to_universal reads them."""
    out: list[SubParams] = []
    entries = info.get("parameter_with_sub_params")
    recorded = info.get("sub_param_shard_widths")
    recorded = recorded if isinstance(recorded, Mapping) else {}
    version = info.get("universal_checkpoint_version")
    for entry in entries if isinstance(entries, list) else []:
        shape = entry.get("shape") if isinstance(entry, Mapping) else None
        dim = entry.get("partition_dim") if isinstance(entry, Mapping) else None
        patterns = entry.get("patterns") if isinstance(entry, Mapping) else None
        if not isinstance(shape, list | tuple) or type(dim) is not int or not 0 <= dim < len(shape) \
                or not isinstance(patterns, list):
            raise InputError(f"a parameter_with_sub_params entry in the run's {UC_INFO} is malformed: {entry!r}", path)
        spec = shape[dim]
        sizes, count = _ints(spec), spec if type(spec) is int and spec > 0 else None
        if sizes is None and count is None:
            raise InputError(f"the parameter_with_sub_params entry for {patterns!r} gives no sub-parameter sizes "
                             f"at partition_dim {dim} ({spec!r})", path)
        for p in map(str, patterns):
            raw = recorded.get(p)
            listed = [_ints(v) for v in raw] if isinstance(raw, list) else None
            widths = tuple(w for w in listed if w is not None) if listed is not None else None
            if listed is not None and (len(widths or ()) != len(listed)
                                       or (sizes is not None and len(listed) != len(sizes))):
                raise InputError(f"sub_param_shard_widths for '{p}' in the run's {UC_INFO} do not match its "
                                 f"sub-parameters {spec!r}", path)
            if widths is None and isinstance(version, int | float) and version >= 0.4:
                raise InputError(f"the run's {UC_INFO} (version {version}) records no sub_param_shard_widths for "
                                 f"the sub-parameters of '{p}': how each rank's share was cut is unknown", path)
            out.append(SubParams(p, dim, len(shape), sizes, count, widths))
    return out


def from_universal_info(info: Mapping[Any, Any], path: str = "") -> TpRules:
    """The rules DeepSpeed's ds_to_universal applies (deepspeed/checkpoint/ds_to_universal.py merge_tp_slices)."""
    def pats(name: str) -> tuple[str, ...]:
        value = info.get(name)
        return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()

    rules = [TpRule(p, TpMerge.REPLICATED) for p in pats("tp_replicated_parameter_patterns")]
    rules += [TpRule(p, TpMerge.TWO_SUB_PARAMS) for p in pats("parameter_with_2_sub_params_cat_dim_0")]
    subs = _sub_params(info, path)  # after replicated, averaged and two-halves; before row-parallel (as there)
    rules += [TpRule(p.pattern, TpMerge.SUB_PARAMS, p.dim) for p in subs]
    rules += [TpRule(p, TpMerge.CONCAT, 1) for p in pats("parameter_with_row_parallelism_patterns")]
    unsupported = [(p, "it is averaged over the ranks (parameter_to_average_patterns); ckpt copies bytes and does "
                    "not compute") for p in pats("parameter_to_average_patterns")]
    # What AutoTP itself cannot describe it lists as unsupported, with its reason (and gives it no affine map).
    autotp = info.get("autotp_unsupported_parameter_patterns")
    for p, reason in autotp.items() if isinstance(autotp, Mapping) else ():
        unsupported.append((str(p), f"AutoTP records it as not convertible ({reason})"))
    # The affine map (universal checkpoint 0.4) places every piece, so it decides before any category, as in
    # ds_to_universal's merge_tp_slices. AutoTP publishes it beside the categories "so a converter that predates
    # the map simply does not see the key and takes the categories" (deepspeed/module_inject/layers.py): a newer
    # encoding than ckpt knows is left unread, and the categories decide alone (refusing what they cannot say).
    affine: list[AffineMap] = []
    amap = info.get("affine_map")
    if isinstance(amap, Mapping) and amap.get("version", AFFINE_VERSION) == AFFINE_VERSION:
        params = amap.get("params")
        for pattern, entry in params.items() if isinstance(params, Mapping) else ():
            affine.append(_affine_map(str(pattern), entry, path))
    size = info.get("original_vocab_size")
    return TpRules(tuple(rules), UC_INFO, regex=True, default=TpRule("", TpMerge.CONCAT, 0),
                   vocab_patterns=pats("vocabulary_parameter_patterns"),
                   vocab_size=size if type(size) is int and size > 0 else None, unsupported=tuple(unsupported),
                   affine=tuple(affine), sub_params=tuple(subs))
