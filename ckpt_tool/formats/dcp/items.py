"""The non-tensor entries of a DCP checkpoint (``BytesStorageMetadata``): described, read on demand, put in place.

Each is a small ``torch.save`` blob in a ``.distcp`` file (an optimizer's
``lr``, ``betas``, a ``params`` list, a step count). Reading the checkpoint
leaves them where they are (a ``BytesItem``, described by its size and
file), so a metadata answer costs the ``.metadata`` file alone; torch's
``dcp_to_torch_save`` writes them into its output as the values they are,
so the data paths read them (formats/dcp/deferred.py) with the restricted
unpickler, their globals reported like any pickle's. The nesting of the
original state_dict comes back from ``planner_data`` the way torch's
``_unflatten_state_dict`` rebuilds it: integer path elements are list
indices (``param_groups`` is a list).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from itertools import pairwise
from typing import Any

from ...errors import InputError
from ...io import paths
from ...limits import Limits
from ...model import Deferred, GlobalRef

MAX_LIST_INDEX = 1 << 20  # a list index past this in planner_data is not a real state_dict


class BytesItem(Deferred):
    """One bytes item: ``nbytes`` bytes at ``offset`` in the shard file ``file`` of ``folder``."""

    kind = "bytes item"

    def __init__(self, folder: str, file: str, offset: int, nbytes: int, transforms: tuple[str, ...],
                 fqn: str, limits: Limits) -> None:
        self.folder, self.file, self.offset, self.nbytes = folder, file, offset, nbytes
        self.transforms, self.fqn, self.limits = transforms, fqn, limits

    def describe(self) -> str:
        if self.transforms:
            return f"<{self.kind}: {self.nbytes} bytes in {self.file}, stored with {list(self.transforms)}, not read>"
        return super().describe()

    def load(self, opened: dict[str, Any]) -> tuple[Any, list[GlobalRef]] | None:
        from ..torchsave import read_torch_blob

        path = paths.join(self.folder, self.file)
        if self.transforms:
            raise InputError(f"it is stored with DCP transforms {list(self.transforms)}, which ckpt cannot read", path)
        if not paths.is_url(path) and not os.path.isfile(path):
            return None  # a metadata-only copy: read_dcp has said so
        source = opened.get(path)
        if source is None:
            source = opened[path] = paths.open_bytes(path)
        blob = source.read(self.offset, self.nbytes)
        value, refs = read_torch_blob(blob, path=path, where=f"bytes item {self.fqn!r}", limits=self.limits)
        return value, list(refs)


def nest(flat: OrderedDict[str, Any], planner_data: Any) -> Any:
    """The saved state_dict's nesting ({"model": {...}, "optim": {"param_groups": [...]}}) from planner_data.

    Falls back to the flat names when planner_data is missing or contradicts itself.
    """
    if not isinstance(planner_data, dict):
        return flat
    root: OrderedDict[str, Any] = OrderedDict()
    for fqn, value in flat.items():
        path = planner_data.get(fqn)
        if not (isinstance(path, tuple) and path and all(type(p) in (str, int) for p in path)):
            path = (fqn,)
        if not _set_element(root, path, value):
            return flat
    return root


def _extend(lst: list[Any], index: int) -> bool:
    if not 0 <= index < MAX_LIST_INDEX:
        return False
    if len(lst) <= index:
        lst.extend([None] * (index + 1 - len(lst)))
    return True


def _set_element(root: OrderedDict[str, Any], path: tuple[Any, ...], value: Any) -> bool:
    """torch.distributed.checkpoint's _set_element: dicts for str keys, lists for int ones."""
    node: Any = root
    for prev, key in pairwise(path):
        default: Any = OrderedDict() if type(key) is str else []
        if isinstance(node, dict):
            node = node.setdefault(prev, default)
        elif isinstance(node, list) and type(prev) is int and _extend(node, prev):
            if node[prev] is None:
                node[prev] = default
            node = node[prev]
        else:
            return False
        if not isinstance(node, (dict, list)):
            return False
    key = path[-1]
    if isinstance(node, list):
        if type(key) is not int or not _extend(node, key) or node[key] is not None:
            return False
    elif key in node:
        return False
    node[key] = value
    return True
