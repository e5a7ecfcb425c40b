"""Real torch tensors (from ``--unsafe`` loads) as TensorMeta, with their bytes readable.

Only reached when a checkpoint was loaded by torch itself; it imports torch,
which every other metadata path avoids. Each storage is exposed once, as a
zero-copy byte view registered in the checkpoint's MemorySource, so tensors
that share storage are still reported as sharing it.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from ... import dtypes
from ...errors import InputError
from ...io import MemorySource
from ...model import StorageRef, TensorMeta

if TYPE_CHECKING:
    from torch.nn import Module

# What the Python API takes in place of a path: a state dict (or a container holding one), or an nn.Module.
InMemoryState: TypeAlias = "Mapping[str, Any] | Module"

# MemorySource -> {storage data_ptr: key in its buffers}
_STORAGE_KEYS: weakref.WeakKeyDictionary[MemorySource, dict[int, str]] = weakref.WeakKeyDictionary()
# storage data_ptr -> the location torch.load saw for it ("cuda:1"), filled by formats.unsafe
_SAVED_LOCATIONS: dict[int, str] = {}


def remember_locations(locations: dict[int, str]) -> None:
    """Record where each storage of the latest --unsafe load was saved from."""
    _SAVED_LOCATIONS.clear()
    _SAVED_LOCATIONS.update(locations)


def in_memory_state(obj: object) -> tuple[dict[str, Any], str] | None:
    """(the state dict, a label for reports) of an nn.Module or a mapping of tensors; None for anything else.

    A module gives its ``state_dict()``; a mapping is taken as it is (a state
    dict, or a container such as ``{"model": sd, "epoch": 3}`` that ``key``
    selects in). The tensors are not copied: TensorMeta views of them are
    built by ``torch_tensor_meta`` as for an --unsafe load.
    """
    import torch

    if isinstance(obj, torch.nn.Module):
        return dict(obj.state_dict()), f"<{type(obj).__name__}.state_dict()>"
    if isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj):
            bad = next(k for k in obj if not isinstance(k, str))
            raise InputError(f"a state dict's keys are strings; this mapping has the key {bad!r}")
        return dict(obj), "<state_dict>"
    return None


def torch_tensor_meta(key: str, tensor: Any, memory: MemorySource) -> TensorMeta:
    """Describe a real torch tensor; its bytes stay in memory behind ``memory``."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{key!r} is a {type(tensor).__name__}, not a tensor")
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in dtypes.BY_NAME:
        raise InputError(f"tensor {key!r} has dtype {name}, which ckpt does not support")
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise InputError(f"tensor {key!r} is {'quantized' if tensor.is_quantized else str(tensor.layout)}; "
                         "ckpt handles dense tensors only")
    t = tensor.detach()
    shape = tuple(int(d) for d in t.shape)
    stride = tuple(int(s) for s in t.stride())
    if t.device.type == "meta":
        return TensorMeta(key, name, shape, stride, int(t.storage_offset()), None, "meta")
    if t.device.type != "cpu":
        t = t.cpu()
    storage = t.untyped_storage()
    ptr = storage.data_ptr()
    keys = _STORAGE_KEYS.setdefault(memory, {})
    skey = keys.get(ptr)
    if skey is None:
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        skey = memory.add(memoryview(flat.numpy()))  # type: ignore[arg-type]  # zero-copy view
        keys[ptr] = skey
    device = _SAVED_LOCATIONS.get(ptr, str(tensor.device))
    return TensorMeta(key, name, shape, stride, int(t.storage_offset()),
                      StorageRef(memory, skey, storage.nbytes()), device)
