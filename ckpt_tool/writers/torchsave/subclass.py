"""Writing back a tensor subclass (pickles/unpickle/placeholders.py SubclassTensor) exactly as torch pickles it.

A wrapper subclass (torchao's Int8Tensor, ...) is
``_rebuild_from_type_v2(_rebuild_wrapper_subclass, T, (T, dtype, size, stride, offset,
_get_layout(name), device(spec), requires_grad), state)``; a subclass over its own
storage (``as_subclass``, a tensor with attributes) is
``_rebuild_from_type_v2(_rebuild_tensor_v2, T, (storage, offset, size, stride, ...), state)``.
The class is written by name (refused where it can run code, writers/torchsave/inert.py)
and the state's tensors and records like any others.
"""
from __future__ import annotations

import pickle
from typing import Any

from ...pickles.unpickle import SubclassTensor
from .ints import _int, _int_tuple

_P = pickle


def written_device(rec: SubclassTensor) -> str:
    """The device a wrapper is written with: its tensors are written as CPU tensors (as every tensor migrate
    writes), so a wrapper saved on a GPU is written on the CPU too, never a CUDA wrapper around CPU data."""
    return rec.device if rec.device in ("cpu", "meta") else "cpu"


def save_subclass(p: Any, rec: SubclassTensor) -> None:
    """Write ``rec`` with pickler ``p`` (writers/torchsave/datapkl.py TorchPickler), memoized like any object."""
    found = p.memo.get(id(rec))
    if found is not None:
        p.write(p.get(found[0]))
        return
    g = p._global
    if rec.base is not None:
        rebuild, args = p.base_call(rec.base, rec.requires_grad)
        p.write(g("torch._tensor", "_rebuild_from_type_v2") + _P.MARK + rebuild)
        p.save(rec.cls)
        p.write(args)
    else:
        p.write(g("torch._tensor", "_rebuild_from_type_v2") + _P.MARK + g("torch._utils", "_rebuild_wrapper_subclass"))
        p.save(rec.cls)
        p.write(_P.MARK)
        p.save(rec.cls)
        p.write(g("torch", rec.dtype.name) + _int_tuple(tuple(rec.shape)) + _int_tuple(tuple(rec.stride))
                + _int(rec.storage_offset) + g("torch.serialization", "_get_layout"))
        # layout and device names through the pickler's constants: "cpu" is also the storages' location string,
        # and one string object must have one memo entry
        p.write(p._constant(rec.layout) + _P.TUPLE1 + _P.REDUCE + g("torch", "device")
                + p._constant(written_device(rec)))
        p.write(_P.TUPLE1 + _P.REDUCE + (_P.NEWTRUE if rec.requires_grad else _P.NEWFALSE) + _P.TUPLE)
    p.save(rec.state)
    p.write(_P.TUPLE + _P.REDUCE)
    p.memoize(rec)
