"""TensorMetas for a located state_dict, and what their storages and devices say.

Turns what the restricted unpickler (or a reader) produced for each tensor
into a validated TensorMeta, checking shape, stride and offset against the
storage once per distinct layout; then notes devices and shared storages.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from math import prod
from operator import attrgetter
from typing import Any

from ...errors import InputError
from ...io import MemorySource
from ...model import GlobalRef, StorageRef, SubclassMeta, TensorMeta, contiguous_strides
from ...pickles.unpickle import ALLOWED, LazyTensor, NumpyArray, Placeholder, SubclassTensor

_KEY = attrgetter("key")
_DEVICE = attrgetter("device")
_STORAGE_ID = attrgetter("storage_id")


_INT_ONLY = {int}


def _valid_dims(values: Any) -> bool:
    """A tuple of non-negative ints (C-speed checks: this runs once per tensor)."""
    return type(values) is tuple and (not values or (set(map(type, values)) == _INT_ONLY and min(values) >= 0))


_INT_OR_BOOL = {int, bool}


def _layout_info(shape: Any, stride: Any) -> tuple[tuple[int, ...], tuple[int, ...], int, int] | None:
    """(shape, stride, numel, index of the last element) if both are valid, else None.

    Bools count as the ints they equal (as in torch.Size): the cache in
    metas_of matches (True, 4) to (1, 4), so both must read the same.
    """
    if not (type(shape) is tuple and type(stride) is tuple and len(stride) == len(shape)):
        return None
    dims = shape + stride
    types = set(map(type, dims))
    if not types <= _INT_OR_BOOL:
        return None
    if bool in types:
        shape, stride = tuple(map(int, shape)), tuple(map(int, stride))
        dims = shape + stride
    if dims and min(dims) < 0:
        return None
    numel = prod(shape)
    last = (numel - 1 if stride == contiguous_strides(shape)
            else sum((d - 1) * s for d, s in zip(shape, stride, strict=False)))
    return shape, stride, numel, last


def metas_of(held: Mapping[str, Any], memory: MemorySource) -> list[TensorMeta]:
    """TensorMetas for a state_dict's values (to_meta, with a fast path for pickled tensors).

    A model has few distinct (shape, stride) pairs, so their checks run once
    per pair; the validated tuples are shared, which also turns a pickle's
    bool dims into ints (as torch.Size does).
    """
    values = list(held.values())
    if set(map(type, values)) == {TensorMeta} and list(map(_KEY, values)) == list(held):
        return values  # already TensorMetas under their own keys (sharded safetensors)
    checked: dict[Any, Any] = {}
    out: list[TensorMeta] = []
    append = out.append
    for key, obj in held.items():
        st = obj.storage if type(obj) is LazyTensor and obj.quantizer is None else None
        if st is None:
            append(to_meta(key, obj, memory))
            continue
        pair = (obj.shape, obj.stride)
        try:
            info = checked[pair]
        except KeyError:
            info = checked[pair] = _layout_info(*pair)
        except TypeError:  # unhashable dims: to_meta names the tensor
            info = None
        offset = obj.storage_offset
        if info is None or type(offset) is not int or offset < 0:
            append(to_meta(key, obj, memory))  # raises the error that names the tensor
            continue
        shape, stride, numel, last = info
        if numel and (offset + last + 1) * obj.dtype.itemsize > st.nbytes:
            append(to_meta(key, obj, memory))
            continue
        append(TensorMeta(key, obj.dtype.name, shape, stride, offset, st.ref, st.location))
    return out


def to_meta(key: str, obj: Any, memory: MemorySource) -> TensorMeta:
    if type(obj) is LazyTensor:
        st = obj.storage
        shape, stride, offset = obj.shape, obj.stride, obj.storage_offset
        if not (type(shape) is tuple and type(stride) is tuple and len(stride) == len(shape)
                and type(offset) is int and offset >= 0 and _valid_dims(shape + stride)):
            raise InputError(f"tensor {key!r} has an invalid shape, stride or offset")
        if st is None:
            return TensorMeta(key, obj.dtype.name, shape, stride, offset, None, "meta")
        numel = prod(shape)
        if numel:
            # the last element's byte, as TensorMeta.byte_span computes it (inlined: once per tensor)
            last = offset + (numel - 1 if stride == contiguous_strides(shape)
                             else sum((d - 1) * s for d, s in zip(shape, stride, strict=True)))
            dt = obj.dtype
            if ((last + 1) * dt.itemsize if dt.per_byte == 1 else dt.nbytes(last + 1)) > st.nbytes:
                raise InputError(f"tensor {key!r} reaches past the end of its storage ({st.nbytes} bytes)")
        quantizer = quantizer_meta(key, obj.quantizer, memory) if obj.quantizer is not None else None
        return TensorMeta(key, obj.dtype.name, shape, stride, offset, st.ref, st.location, quantizer)
    if isinstance(obj, TensorMeta):
        return obj if obj.key == key else TensorMeta(key, obj.dtype, obj.shape, obj.stride, obj.storage_offset,
                                                      obj.storage, obj.device, obj.quantizer, obj.subclass)
    if isinstance(obj, SubclassTensor):
        return subclass_meta(key, obj, memory)
    if isinstance(obj, NumpyArray):
        if obj.dtype is None:
            raise InputError(f"NumPy array {key!r} has an unsupported dtype {obj.type_string!r}")
        shape = obj.shape
        stride = contiguous_strides(shape)
        if obj.fortran and len(shape) > 1:
            stride = tuple(reversed(contiguous_strides(tuple(reversed(shape)))))
        nbytes = len(obj.data)
        ref = StorageRef(memory, memory.add(obj.data), nbytes)
        return TensorMeta(key, obj.dtype.name, shape, stride, 0, ref, "cpu")
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        # a corrupt module's _parameters can hold anything: never import torch to say so
        raise InputError(f"{key!r} is a {type(obj).__name__}, not a tensor")
    from ...tensors.data import torch_tensor_meta  # only reached for --unsafe loads

    return torch_tensor_meta(key, obj, memory)


def subclass_meta(key: str, obj: SubclassTensor, memory: MemorySource) -> TensorMeta:
    """A tensor subclass: its outer dtype and shape, no storage, and its inner tensors (validated like any)."""
    shape, stride, offset = obj.shape, obj.stride, obj.storage_offset
    if not (len(stride) == len(shape) and offset >= 0 and _valid_dims(shape + stride)):
        raise InputError(f"tensor subclass {key!r} ({obj.qualname}) has an invalid shape, stride or offset")
    inner = tuple((name, to_meta(f"{key}.{name}", t, memory)) for name, t in obj.inner())
    sub = SubclassMeta(obj.qualname, inner, obj.layout, obj)
    if obj.base is not None:  # a subclass over its own storage: that tensor, with the class and state beside it
        base = to_meta(key, obj.base, memory)
        return TensorMeta(key, base.dtype, base.shape, base.stride, base.storage_offset, base.storage, base.device,
                          subclass=sub)
    return TensorMeta(key, obj.dtype.name, shape, stride, offset, None, obj.device, subclass=sub)


def quantizer_meta(key: str, params: tuple[Any, ...], memory: MemorySource) -> tuple[Any, ...]:
    """A quantized tensor's quantizer with its per-channel scales and zero points as TensorMetas.

    The scheme is kept by name, scalars as pickled (a float scale, an int zero
    point), so a torch output writes back exactly what the source held.
    """
    scheme = str(params[0])
    if len(params) == 3:
        _, scale, zero = params
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not isinstance(zero, int):
            raise InputError(f"quantized tensor {key!r} has a scale or zero point that is not a number")
        return (scheme, scale, zero)
    if len(params) == 4:
        _, scales, zeros, axis = params
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise InputError(f"quantized tensor {key!r} has a per-channel axis that is not an int")
        return (scheme, _quantizer_part(f"{key}<scales>", scales, memory),
                _quantizer_part(f"{key}<zero_points>", zeros, memory), axis)
    raise InputError(f"quantized tensor {key!r} has a quantizer of {len(params)} parts; expected 3 or 4")


def quantizer_note(q: tuple[Any, ...]) -> str:
    """inspect's note for a quantized tensor: its scheme with the scale and zero point, or the axis."""
    if len(q) == 3:
        return f"{q[0]} scale={q[1]:.6g} zero_point={q[2]}"
    count = q[1].numel if isinstance(q[1], TensorMeta) else len(q[1])
    return f"{q[0]} axis={q[3]} ({count} scales and zero points)"


def _quantizer_part(key: str, value: Any, memory: MemorySource) -> Any:
    if isinstance(value, list):  # torch accepts lists of numbers here (_rebuild_qtensor)
        return list(value)
    return to_meta(key, value, memory)


def layout_warnings(tensors: Sequence[TensorMeta]) -> list[str]:
    warnings = []
    all_devices = set(map(_DEVICE, tensors))  # C-speed passes: this runs on 200,000 tensors
    devices = sorted(all_devices - {"cpu", "meta"})
    if devices:
        warnings.append(f"tensors were saved on {', '.join(devices)}; ckpt reads them on the CPU")
    if "meta" in all_devices:
        warnings.append("some tensors were saved on the meta device and hold no data")
    ids = list(map(_STORAGE_ID, tensors))
    if len(set(ids)) == len(ids):
        return warnings  # no storage is shared (the common case, checked at C speed)
    groups: dict[Any, list[str]] = {}
    for t in tensors:
        sid = t.storage_id
        if sid is not None:
            groups.setdefault(sid, []).append(t.key)
    shared = [keys for keys in groups.values() if len(keys) > 1]
    if shared:
        sample = "; ".join(" = ".join(ks[:3]) for ks in shared[:3])
        warnings.append(f"{sum(len(s) for s in shared)} tensors share storage ({sample})")
    return warnings


# The function _rebuild_from_type_v2 applies: the unpickler turns the pair into a SubclassTensor or a DTensor /
# ShardedTensor record (pickles/unpickle/wrappers.py), so naming it alone leaves no record to find.
_APPLIED = frozenset({"torch._utils._rebuild_wrapper_subclass"})


def record_warnings(root: Any, references: Iterable[GlobalRef]) -> list[str]:
    """Tensors torch rebuilds in a layout ckpt keeps as records (sparse COO/CSR/CSC/BSR/BSC, other ``_rebuild_*``
    calls): never dropped in silence. They are listed under metadata, not compared or checked for NaN; a .pth
    output writes them back as pickled, flat outputs refuse them (writers/layout.py). Only a pickle that named
    such a rebuild (``references``) is searched: a plain state dict costs nothing."""
    named = sorted({r.qualname for r in references if r.name.startswith("_rebuild")
                    and r.module.startswith("torch") and (r.module, r.name) not in ALLOWED})
    if not named:
        return []
    found: list[str] = []
    _records(root, "", 0, found)
    if not found:  # named but not located (held where the search does not reach): say so, never nothing
        lost = [n for n in named if n not in _APPLIED]
        return [f"the pickle calls {', '.join(lost)}, which rebuilds a tensor ckpt keeps as a record, but ckpt "
                "did not locate it: it is not listed, compared or checked for NaN"] if lost else []
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return [f"{len(found)} tensor(s) torch rebuilds in a layout ckpt keeps as a record ({shown}): listed under "
            "metadata, not compared or checked for NaN; a .pth output writes them back as they are, .safetensors "
            "and other flat outputs refuse them"]


def _records(obj: Any, at: str, depth: int, found: list[str]) -> None:
    """Depth as writers/layout.py's search for held tensors; into mappings, sequences and objects' state."""
    if depth > 32:
        return
    if isinstance(obj, Placeholder):
        if obj._ckpt_module.startswith("torch") and obj._ckpt_name.startswith("_rebuild"):
            found.append(f"{at or '<root>'}: {_describe_record(obj)}")
            return
        obj = obj.attributes
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _records(v, f"{at}.{k}" if at else str(k), depth + 1, found)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _records(v, f"{at}.{i}" if at else str(i), depth + 1, found)


def _describe_record(obj: Placeholder) -> str:
    args = obj.args
    if obj._ckpt_name == "_rebuild_sparse_tensor" and len(args) == 2 and isinstance(args[1], tuple):
        layout = str(args[0]).removeprefix("torch.")
        size = next((a for a in args[1] if isinstance(a, tuple) and all(type(d) is int for d in a)), None)
        return f"{layout} {list(size)}" if size is not None else layout
    return f"{obj._ckpt_module}.{obj._ckpt_name}"
