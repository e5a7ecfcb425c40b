"""The prefixes wrappers leave on every key (DataParallel, torch.compile, Lightning), and finding them.

Apart from the rewrite rules (rules.py) because ``inspect`` reports them for
every file and needs nothing else from this package.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# Prefixes left by wrappers: DataParallel/DDP, torch.compile, Lightning, both.
KNOWN_PREFIXES = ("module._orig_mod.", "_orig_mod.module.", "module.", "_orig_mod.", "model.")


def detect_prefixes(keys: Iterable[str]) -> list[str]:
    """Prefixes that every key carries: known wrapper prefixes, else the longest common one."""
    keys = list(keys)
    if not keys:
        return []
    found: list[str] = []
    for p in KNOWN_PREFIXES:
        if all(k.startswith(p) for k in keys) and not any(f.startswith(p) for f in found):
            found.append(p)
    if found:
        return found
    heads = Counter(k.split(".", 1)[0] + "." for k in keys if "." in k)
    if len(heads) == 1 and len(keys) > 1:
        (head, count), = heads.items()
        if count == len(keys):
            return [head]
    return []
