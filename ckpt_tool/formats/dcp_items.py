"""The non-tensor entries of a DCP checkpoint (``BytesStorageMetadata``): read, and put back in place.

Each is a small ``torch.save`` blob in a ``.distcp`` file (an optimizer's
``lr``, ``betas``, a ``params`` list, a step count); torch's
``dcp_to_torch_save`` writes them into its output as the values they are,
so ckpt reads them too (with the restricted unpickler, their globals
reported like any pickle's), up to a size limit that keeps a metadata
answer cheap. The nesting of the original state_dict comes back from
``planner_data`` the way torch's ``_unflatten_state_dict`` rebuilds it:
integer path elements are list indices (``param_groups`` is a list).
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from ..errors import CkptError
from ..io import paths
from ..io.bytesource import ByteSource
from ..limits import Limits
from ..model import GlobalRef

MAX_ITEM_BYTES = 1 << 20  # a larger bytes item stays "not read" (a dataloader state, say)
MAX_TOTAL_BYTES = 64 << 20
MAX_LIST_INDEX = 1 << 20  # a list index past this in planner_data is not a real state_dict


def read_items(folder: str, items: dict[str, Any], limits: Limits) -> tuple[dict[str, Any], list[GlobalRef], list[str]]:
    """(fqn -> value, globals their pickles name, warnings) for the bytes items ``fqn -> chunk``.

    Items that are too large, or whose shard file is absent, are left out
    (the caller keeps its "not read" description).
    """
    from .blob import read_torch_blob

    values: dict[str, Any] = {}
    refs: list[GlobalRef] = []
    warnings: list[str] = []
    total = 0
    skipped = []
    fds: dict[str, ByteSource] = {}
    try:
        for fqn, chunk in items.items():
            file = paths.join(folder, chunk.relative_path)
            if chunk.transforms or chunk.length > MAX_ITEM_BYTES or total + chunk.length > MAX_TOTAL_BYTES:
                skipped.append(fqn)
                continue
            if not paths.is_url(file) and not os.path.isfile(file):
                continue  # a metadata-only copy: read_dcp has said so
            total += chunk.length
            try:
                fd = fds.get(file)
                if fd is None:
                    fd = fds[file] = paths.open_bytes(file)
                blob = fd.read(chunk.offset, chunk.length)
                value, found = read_torch_blob(blob, path=file, where=f"bytes item {fqn!r}", limits=limits)
            except CkptError as exc:  # one unreadable item is reported and left out, as torch would fail on it
                warnings.append(f"the non-tensor entry {fqn!r} cannot be read: {exc.message}")
                continue
            values[fqn] = value
            refs += found
    finally:
        for fd in fds.values():
            fd.close()
    if skipped:
        warnings.append(f"{len(skipped)} non-tensor entr{'y is' if len(skipped) == 1 else 'ies are'} too large to "
                        f"read as metadata and kept as descriptions: {', '.join(skipped[:3])}")
    return values, refs, warnings


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
    for prev, key in zip(path, path[1:]):
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
