"""Patterns a reviewed source vouches for, which would otherwise read as calls of unreviewed globals.

``getattr(Outer, "name")`` where the catalog reviewed the dotted name (protocol 2's spelling of a nested
class, or of a method mmengine pickles by reference), and ShardedTensor rebuilt exactly as torch.save writes
it (``init_rrefs`` False). A global met only in such a place is judged safe at the end of the walk; met
anywhere else, it is judged as usual.
"""
from __future__ import annotations

from ...model import GlobalRef
from .. import severity as levels
from ..inert import is_inert
from .values import GETATTR, Glob

FROM_TYPE = frozenset([("torch._tensor", "_rebuild_from_type_v2")])
SHARDED_TENSOR = ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor")
_WRAPPER = ("torch._utils", "_rebuild_wrapper_subclass")


def sharded_tensor_rebuild(argv: tuple[object, ...]) -> bool:
    """``_rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor, (ShardedTensor, ...), state)`` with
    the state torch.save writes and ``init_rrefs`` the constant False (ShardedTensor.__getstate__)."""
    if len(argv) != 4:
        return False
    func, new_type, inner, state = argv
    return (isinstance(func, Glob) and (func.module, func.name) == _WRAPPER and isinstance(new_type, Glob)
            and (new_type.module, new_type.name) == SHARDED_TENSOR and isinstance(inner, tuple) and bool(inner)
            and isinstance(inner[0], Glob) and (inner[0].module, inner[0].name) == SHARDED_TENSOR
            and isinstance(state, tuple) and len(state) == 5 and state[4] is False)


def catalogued_nested(argv: tuple[object, ...]) -> bool:
    """``getattr(Outer, "name")`` whose dotted name ``Outer.name`` the catalog reviewed (a nested class, or a
    method mmengine's HistoryBuffer pickles by reference)."""
    if len(argv) != 2:
        return False
    outer, inner = argv
    return isinstance(outer, Glob) and isinstance(inner, str) and inner.isidentifier() \
        and not inner.startswith("_") and is_inert(outer.module, f"{outer.name}.{inner}")




def only_vouched(g: GlobalRef, vouched: set[tuple[str, str]], called: set[tuple[str, str]],
                 misused: set[tuple[str, str]]) -> bool:
    """Met only where a reviewed pattern vouches for it: getattr only ever resolving a catalogued name (and
    flowing nowhere else), its outer class and ShardedTensor never called but there."""
    key = (g.module, g.name)
    if key not in vouched:
        return False
    if key in GETATTR:  # any other getattr call (dill's idiom, an unreviewed nested name) marks it called
        return key not in misused and key not in called and g.severity == levels.DANGEROUS
    return key not in called and g.severity == levels.SUSPICIOUS
