"""The values a metadata path leaves unread (model.Deferred: DCP bytes items), read by the data paths.

``inspect``, ``diff`` and the gate's checks describe a deferred value
(``<bytes item: 1261 bytes in __0_0.distcp, not read>``) and read nothing:
a DCP folder's metadata costs its ``.metadata`` file alone, local or behind
a URL. ``migrate`` (consolidation, equal to torch's ``dcp_to_torch_save``)
and ``diff --values`` read them here, with the restricted unpickler (their
globals reported like any pickle's), up to a size limit; ``scan`` walks
their pickles itself.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from ...errors import CkptError
from ...limits import DEFAULT_LIMITS, Limits
from ...model import Checkpoint, Deferred, GlobalRef, unread
from ..checkpoint import reference_warnings, summarize

MAX_ITEM_BYTES = 1 << 20  # a larger value stays described, "not read" (a dataloader state, say)
MAX_TOTAL_BYTES = 64 << 20
_MAX_DEPTH = 64


class _Reads:
    """One data path's reads: each value read once, files opened once, a total budget."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.opened: dict[str, Any] = {}
        self.values: dict[int, Any] = {}  # id(deferred) -> its value, or its description when not read
        self.references: list[GlobalRef] = []
        self.warnings: list[str] = []
        self.too_large: list[str] = []
        self.total = 0

    def value(self, item: Deferred, where: str) -> Any:
        key = id(item)
        if key in self.values:
            return self.values[key]
        value: Any = item.describe()
        if item.nbytes > MAX_ITEM_BYTES or self.total + item.nbytes > MAX_TOTAL_BYTES:
            self.too_large.append(where)
        else:
            self.total += item.nbytes
            try:
                got = item.load(self.opened)
            except CkptError as exc:  # one unreadable value is reported and left described, as torch would fail
                self.warnings.append(f"the non-tensor entry {where!r} cannot be read: {exc.message}")
                got = None
            if got is not None:
                value, refs = got
                self.references += refs
        self.values[key] = value
        return value

    def replace(self, obj: Any, path: str, depth: int, shown: bool) -> Any:
        """``obj`` with its deferred values read (``shown``: as summarize() renders them); unchanged
        containers are returned as they are."""
        if isinstance(obj, Deferred):
            value = self.value(obj, path)
            return summarize(value) if shown else value
        if depth >= _MAX_DEPTH:
            return obj
        if isinstance(obj, dict):
            items = [(k, self.replace(v, f"{path}.{k}" if path else str(k), depth + 1, shown)) for k, v in obj.items()]
            if all(new is obj[k] for k, new in items):
                return obj
            return OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
        if isinstance(obj, (list, tuple)):
            values = [self.replace(v, f"{path}.{i}" if path else str(i), depth + 1, shown) for i, v in enumerate(obj)]
            if all(new is old for new, old in zip(values, obj, strict=True)):
                return obj
            return values if isinstance(obj, list) else tuple(values)
        return obj

    def close(self) -> None:
        for source in self.opened.values():
            source.close()
        self.opened.clear()


def with_values(ck: Checkpoint, limits: Limits = DEFAULT_LIMITS) -> Checkpoint:
    """``ck`` with its deferred values read: in ``root`` (what migrate writes) and in ``metadata``
    (what diff compares); the globals their pickles name join the references and warnings."""
    if not unread(ck.metadata) and not unread(ck.root):
        return ck
    reads = _Reads(limits)
    try:
        root = reads.replace(ck.root, "", 0, shown=False)
        metadata = {k: reads.replace(v, str(k), 1, shown=True) for k, v in ck.metadata.items()}
    finally:
        reads.close()
    warnings = list(ck.warnings) + reads.warnings
    if reads.too_large:
        n = len(reads.too_large)
        warnings.append(f"{n} non-tensor entr{'y is' if n == 1 else 'ies are'} too large to read as metadata and "
                        f"kept as descriptions: {', '.join(reads.too_large[:3])}")
    warnings += reference_warnings(reads.references)
    return dataclasses.replace(ck, root=root, metadata=metadata, references=ck.references + tuple(reads.references),
                               warnings=tuple(warnings))
