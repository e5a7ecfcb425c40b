"""Writing back what the restricted unpickler read as inert records, exactly as the source pickled it.

A placeholder remembers its class (module and name), how it was made
(``cls(*args)`` by REDUCE, ``cls.__new__(cls, *args)`` by NEWOBJ, or
``copyreg._reconstructor``), its state (BUILD), appended items and set
items; a NumPy scalar remembers its dtype record and raw bytes. Written back
in that order with the same globals, ``torch.load(weights_only=False)`` of
the output rebuilds the same objects as the source, and nothing was imported
or run to write it. What is never written back: a global that can run code
(severity "dangerous"), a call of an object built at load time, and dill's
by-value code (a .pth that needs dill to load is not a .pth).
"""
from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

from ...errors import UnsafeContentError
from ...pickles import severity
from ...pickles.unpickle import NumpyDType, NumpyScalar, Placeholder, SubclassTensor
from ...tensors.data import is_tensor
from ..base import OutTensor

_MAX_DEPTH = 200
_DILL = ("dill._dill", "dill.dill", "dill")


def why_unwritable(module: str, name: str) -> str | None:
    """Why the global ``module.name`` is never written back, or None."""
    if severity.severity(module, name) == severity.DANGEROUS:
        return "it can run code"
    if module == "<call>":
        return "it is the result of calling an object built at load time"
    if module in _DILL:
        return "it is dill's by-value code, which only dill can load"
    return None


def unwritable(root: Any) -> list[tuple[str, str, str]]:
    """(where, module.name, why) for every record in ``root`` that is never written back, first found first."""
    walk = _Unwritable()
    walk.walk(root, "", 0)
    return walk.found


class _Unwritable:
    """The walk of unwritable(): one method per kind of record, at most 5 found."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str, str]] = []
        self.seen: set[int] = set()

    def walk(self, obj: Any, where: str, depth: int) -> None:
        if depth > _MAX_DEPTH or id(obj) in self.seen or len(self.found) >= 5:
            return
        if isinstance(obj, OutTensor) and obj.source.subclass is not None:
            obj = obj.source.subclass.record
        if isinstance(obj, SubclassTensor):  # its class is written back, and the objects its state holds
            self.seen.add(id(obj))
            if not self.note(where or "<top>", obj.qualname, obj.cls._ckpt_module, obj.cls._ckpt_name):
                self.walk(obj.state, where, depth + 1)
            return
        if isinstance(obj, (str, bytes, int, float, bool)) or obj is None or is_tensor(obj):
            return
        self.seen.add(id(obj))
        if isinstance(obj, type) and issubclass(obj, Placeholder):
            name = f"{obj._ckpt_module}.{obj._ckpt_name}"
            self.note(where or "<top>", name, obj._ckpt_module, obj._ckpt_name)
        elif isinstance(obj, Placeholder):
            self.placeholder(obj, where, depth)
        else:
            self.children(obj, where, depth)

    def note(self, here: str, name: str, module: str, attr: str) -> bool:
        """Record ``module.attr`` when it is never written back; whether it was."""
        why = why_unwritable(module, attr)
        if why:
            self.found.append((here, name, why))
        return bool(why)

    def placeholder(self, obj: Placeholder, where: str, depth: int) -> None:
        here = where or "<top>"
        if self.note(here, obj.qualname, obj._ckpt_module, obj._ckpt_name):
            return
        d = obj.__dict__
        via = d.get("_ckpt_via")
        parts = [*obj.args, *d["_ckpt_kwargs"].values(), d["_ckpt_state"], *d["_ckpt_items"],
                 *d["_ckpt_setitems"].items(), *(via[1:] if isinstance(via, tuple) else ())]
        for i, part in enumerate(parts):
            self.walk(part, f"{here}.<{obj._ckpt_name}>" if i == 0 else where, depth + 1)

    def children(self, obj: Any, where: str, depth: int) -> None:
        if isinstance(obj, NumpyDType):
            self.walk(obj.args, where, depth + 1)
            self.walk(obj.state, where, depth + 1)
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                self.walk(k, where, depth + 1)
                self.walk(v, f"{where}.{k}" if where else str(k), depth + 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(obj):
                self.walk(v, f"{where}.{i}" if where else str(i), depth + 1)


def refuse_unwritable(root: Any, src: str, sd_key: str = "") -> None:
    """Raise (exit 2) naming the first record of ``root`` that is never written back.

    ``sd_key``: where the state_dict is in ``root`` ("" for the top level), to
    suggest ``--drop`` for a state_dict entry and ``--state-dict-only`` otherwise.
    """
    found = unwritable(root)
    if not found:
        return
    where, name, why = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    prefix = f"{sd_key}." if sd_key else ""
    if where.startswith(prefix) and where != "<top>":
        entry = where[len(prefix):].split(".<", 1)[0]
        what, fix = f"the state_dict entry {entry!r}", f"leave it out with --drop '{entry}'"
    else:
        what, fix = f"the metadata at {where!r}", "leave it out with --state-dict-only"
    raise UnsafeContentError(f"{what} holds {name}, which ckpt never writes back: {why}{more}; {fix}", src)


def save_inert(p: Any, obj: Any) -> bool:
    """Write ``obj`` with pickler ``p`` (writers.torchpickle.TorchPickler) if it is an inert record; else False."""
    if isinstance(obj, NumpyScalar):
        _save_numpy_scalar(p, obj)
    elif isinstance(obj, Placeholder):
        _save_placeholder(p, obj)
    elif isinstance(obj, type) and issubclass(obj, Placeholder):
        _check(obj._ckpt_module, obj._ckpt_name)
        p.write(p._global(obj._ckpt_module, obj._ckpt_name))
    elif isinstance(obj, NumpyDType):
        _save_dtype(p, obj)
    else:
        return False
    return True


def _check(module: str, name: str) -> None:
    why = why_unwritable(module, name)
    if why:
        raise UnsafeContentError(f"{module}.{name} is never written back: {why}")


def _again(p: Any, obj: Any) -> bool:
    found = p.memo.get(id(obj))
    if found is not None:
        p.write(p.get(found[0]))
        return True
    return False


def _save_numpy_scalar(p: Any, obj: NumpyScalar) -> None:
    """``numpy.core.multiarray.scalar(dtype, raw)``, as NumPy pickles a scalar (same module as the source)."""
    if _again(p, obj):
        return
    module, dt, raw = obj.numpy
    p.write(p._global(module, "scalar"))
    p.save(dt)
    p.save(raw)
    p.write(pickle.TUPLE2 + pickle.REDUCE)
    p.memoize(obj)


def _save_dtype(p: Any, dt: NumpyDType) -> None:
    if _again(p, dt):
        return
    p.write(p._global("numpy", "dtype"))
    p.save(tuple(dt.args))
    p.write(pickle.REDUCE)
    p.memoize(dt)
    if dt.state is not None:
        p.save(dt.state)
        p.write(pickle.BUILD)


def _save_placeholder(p: Any, obj: Placeholder) -> None:
    if _again(p, obj):
        return
    module, name = obj._ckpt_module, obj._ckpt_name
    _check(module, name)
    d = obj.__dict__
    via = d.get("_ckpt_via", "call")
    kwargs = d["_ckpt_kwargs"]
    if isinstance(via, tuple):  # copyreg._reconstructor(cls, base, state)
        p.write(p._global("copyreg", "_reconstructor"))
        p.save((type(obj), via[1], via[2]))
        p.write(pickle.REDUCE)
    elif kwargs:  # NEWOBJ_EX in the source: protocol 2 spells it copyreg.__newobj_ex__(cls, args, kwargs)
        p.write(p._global("copyreg", "__newobj_ex__"))
        p.save((type(obj), tuple(obj.args), dict(kwargs)))
        p.write(pickle.REDUCE)
    else:
        p.write(p._global(module, name))
        p.save(tuple(obj.args))
        p.write(pickle.REDUCE if via == "call" else pickle.NEWOBJ)
    p.memoize(obj)
    items = d["_ckpt_items"]
    if items:
        p.write(pickle.MARK)
        for item in items:
            p.save(item)
        p.write(pickle.APPENDS)
    setitems = d["_ckpt_setitems"]
    if setitems:
        p.write(pickle.MARK)
        for k, v in setitems.items():
            p.save(k)
            p.save(v)
        p.write(pickle.SETITEMS)
    state = d["_ckpt_state"]
    if state is not None:
        p.save(state)
        p.write(pickle.BUILD)


__all__ = ["refuse_unwritable", "save_inert", "unwritable", "why_unwritable"]
