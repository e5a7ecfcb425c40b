"""Wrapper tensor subclasses as torch pickles them, read without importing their classes.

``torch.Tensor.__reduce_ex__`` of a wrapper subclass writes
``_rebuild_from_type_v2(_rebuild_wrapper_subclass, T, (T, dtype, size, stride, offset,
layout, device, requires_grad), state)``. DTensor and ShardedTensor become records
formats/ranks/ reads; any other class (torchao's quantized tensors) a SubclassTensor,
listed as a tensor and written back by the torch writer as it was pickled.
"""
from __future__ import annotations

import pickle
from typing import Any

from ... import dtypes
from .placeholders import DTypeRef, Placeholder, SubclassTensor

# DTensor and ShardedTensor pickle themselves (torch/_tensor.py, __reduce_ex__ of a wrapper subclass) as
# _rebuild_from_type_v2(_rebuild_wrapper_subclass, T, (T, dtype, size, stride, offset, layout, device,
# requires_grad), state): the global dtype and shape, and in ``state`` the rank's local tensor(s) and placement.
DISTRIBUTED_TENSORS = frozenset({
    ("torch.distributed.tensor", "DTensor"), ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor"),
})
_WRAPPER_REBUILD = ("torch._utils", "_rebuild_wrapper_subclass")


def distributed_tensor(func: Any, new_type: Any, args: Any, state: Any) -> Placeholder | None:
    """A DTensor or ShardedTensor, exactly as pickled: a placeholder of its class holding the wrapper's
    arguments (without the class) and its state; None for any other rebuild. Nothing is imported or run:
    formats/ranks/ reads the placement from the record."""
    if not (_is_placeholder(func, _WRAPPER_REBUILD) and isinstance(new_type, type) and issubclass(new_type, Placeholder)
            and (new_type._ckpt_module, new_type._ckpt_name) in DISTRIBUTED_TENSORS
            and isinstance(args, tuple) and len(args) == 8 and args[0] is new_type):
        return None
    obj = new_type.__new__(new_type, *args[1:])
    obj.__setstate__(state)
    return obj


def wrapper_subclass(func: Any, new_type: Any, args: Any, state: Any) -> SubclassTensor | None:
    """Any other wrapper subclass (torchao's quantized tensors): a SubclassTensor holding the wrapper's
    arguments and its state as pickled; None when the call is not the shape torch writes."""
    if not (_is_placeholder(func, _WRAPPER_REBUILD) and isinstance(new_type, type) and issubclass(new_type, Placeholder)
            and isinstance(args, tuple) and len(args) == 8 and args[0] is new_type):
        return None
    _, dtype, size, stride, offset, layout, device, requires_grad = args
    if not isinstance(dtype, DTypeRef) or dtype.name not in dtypes.BY_NAME:
        raise pickle.UnpicklingError(f"tensor subclass {new_type._ckpt_module}.{new_type._ckpt_name} has an "
                                     f"unsupported dtype {getattr(dtype, 'name', dtype)!r}")
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and isinstance(offset, int)
            and isinstance(layout, str) and isinstance(device, str)):
        raise pickle.UnpicklingError(f"tensor subclass {new_type._ckpt_module}.{new_type._ckpt_name} has an "
                                     "invalid size, stride, offset, layout or device")
    return SubclassTensor(new_type, dtypes.BY_NAME[dtype.name], tuple(size), tuple(stride), offset, layout, device,
                          bool(requires_grad), state)


def _is_placeholder(obj: Any, key: tuple[str, str]) -> bool:
    return isinstance(obj, type) and issubclass(obj, Placeholder) and (obj._ckpt_module, obj._ckpt_name) == key
