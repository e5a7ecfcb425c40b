"""``ckpt diff``'s metadata comparison: the non-tensor entries of two checkpoints.

Differences in epochs, optimizer state or a safetensors ``__metadata__``
never change what load_state_dict does; they are reported, and fail the
diff only with ``--fail-on-metadata``.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from ...format_names import Format
from ...model import Checkpoint, Deferred, json_safe
from .parts import MetadataChange, MetadataDiff, MetadataOnly

P = TypeVar("P", MetadataChange, MetadataOnly)

# Metadata a reader adds about the file's layout, not about its contents: not diffed.
LAYOUT_METADATA: dict[Format, tuple[str, ...]] = {Format.SHARDED: ("shards", "shard_format", "metadata")}
_MAX_METADATA_ITEMS = 2000
NOT_READ = "<not read>"  # where a side left a value unread (a DCP bytes item): not compared


def metadata_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> MetadataDiff:
    """Differences in non-tensor entries, found with deepdiff, with JSON-safe values.

    ``changed``: paths whose value differs (``a``, ``b``); ``only_a`` /
    ``only_b``: paths present on one side only. Paths are dotted
    (``optimizer.param_groups.0.lr``); list order matters.
    """
    quick = _flat_metadata_diff(a, b)
    if quick is not None:
        return quick
    if _identical(a, b):  # the same nested metadata on both sides (a file against its copy)
        return MetadataDiff()
    from deepdiff import DeepDiff

    tree = DeepDiff(dict(a), dict(b), view="tree", verbose_level=2, threshold_to_diff_deeper=0,
                    ignore_private_variables=False)
    changed: list[MetadataChange] = []
    only_a: list[MetadataOnly] = []
    only_b: list[MetadataOnly] = []
    for kind, levels in tree.items():
        for level in levels:
            path = _dotted(level.path(output_format="list"))
            if kind in ("dictionary_item_removed", "iterable_item_removed", "attribute_removed",
                        "set_item_removed"):
                only_a.append(MetadataOnly(path, json_safe(level.t1)))
            elif kind in ("dictionary_item_added", "iterable_item_added", "attribute_added", "set_item_added"):
                only_b.append(MetadataOnly(path, json_safe(level.t2)))
            else:  # values_changed, type_changes; repetition changes and the like: show both sides
                changed.append(MetadataChange(path, json_safe(level.t1), json_safe(level.t2)))
    return _found(changed, only_a, only_b)


def _found(changed: list[MetadataChange], only_a: list[MetadataOnly], only_b: list[MetadataOnly]) -> MetadataDiff:
    """The differences in path order, each kind cut to its first 2,000."""
    def first(items: list[P]) -> tuple[P, ...]:
        return tuple(sorted(items, key=attrgetter("path"))[:_MAX_METADATA_ITEMS])

    return MetadataDiff(changed=first(changed), only_a=first(only_a), only_b=first(only_b))


_SCALARS = (str, int, float, bool, type(None))


def _flat_metadata_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> MetadataDiff | None:
    """What DeepDiff reports when every key present on both sides holds a scalar; else None.

    The common case (a safetensors ``__metadata__`` on one side only, equal
    epochs) then needs no deepdiff import, which costs more than the whole
    metadata diff of a multi-GB pair.
    """
    if not all(type(k) is str for k in (*a, *b)):
        return None
    common = [k for k in a if k in b]
    if not all(type(a[k]) in _SCALARS and type(b[k]) in _SCALARS for k in common):
        return None
    # a type change (1 vs 1.0, True vs 1) counts as a change, as in DeepDiff; so does NaN vs NaN
    changed = [MetadataChange(k, json_safe(a[k]), json_safe(b[k])) for k in common
               if type(a[k]) is not type(b[k]) or a[k] != b[k]]
    only_a = [MetadataOnly(k, json_safe(v)) for k, v in a.items() if k not in b]
    only_b = [MetadataOnly(k, json_safe(v)) for k, v in b.items() if k not in a]
    return _found(changed, only_a, only_b)


def _identical(x: Any, y: Any) -> bool:
    """True only where DeepDiff would report nothing: same types, equal values, no NaN, all the way down.

    Anything else (sets, other objects, a NaN, 1 against 1.0) is False and
    left to DeepDiff, so this can only save its import (~0.2 s), never
    change an answer.
    """
    if type(x) is not type(y):
        return False
    if type(x) in (dict, OrderedDict):
        return x.keys() == y.keys() and all(_identical(v, y[k]) for k, v in x.items())
    if type(x) in (list, tuple):
        return len(x) == len(y) and all(map(_identical, x, y))
    return type(x) in _SCALARS and x == y  # a NaN is not equal to itself: False


def mask_unread(a: Any, b: Any, depth: int = 0) -> tuple[Any, Any, int]:
    """(a, b, count): values either side left unread (model.Deferred: a DCP bytes item without --values)
    replaced by one marker on both sides, so they are not compared; ``count`` of them. A value present on
    one side only is still reported there (described)."""
    if isinstance(a, Deferred) or isinstance(b, Deferred):
        return NOT_READ, NOT_READ, 1
    if depth > 64:
        return a, b, 0
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return _mask_mappings(a, b, depth)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return _mask_sequences(a, b, depth)
    return a, b, 0


def _mask_mappings(a: Mapping[Any, Any], b: Mapping[Any, Any], depth: int) -> tuple[Any, Any, int]:
    total = 0
    a2, b2 = dict(a), dict(b)
    for k in a2.keys() & b2.keys():
        a2[k], b2[k], n = mask_unread(a2[k], b2[k], depth + 1)
        total += n
    return (a2, b2, total) if total else (a, b, 0)


def _mask_sequences(a: list[Any] | tuple[Any, ...], b: list[Any] | tuple[Any, ...],
                    depth: int) -> tuple[Any, Any, int]:
    pairs = [mask_unread(x, y, depth + 1) for x, y in zip(a, b, strict=True)]
    total = sum(n for _, _, n in pairs)
    if not total:
        return a, b, 0
    return type(a)(x for x, _, _ in pairs), type(b)(y for _, y, _ in pairs), total


def _dotted(parts: Sequence[Any]) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def content_metadata(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's metadata without what only describes the file layout (shard lists)."""
    skip = LAYOUT_METADATA.get(ckpt.format, ())
    return {str(k): v for k, v in ckpt.metadata.items() if k not in skip}
