"""Quantized tensors as torch objects, and quantized modules' packed params, for loading into a target.

ckpt lists the tensors inside packed params under ``KEY.0``, ``KEY.1``
(tensors/packed.packed_items); a quantized module takes them back as the
tuple it saved. The integer data and the quantizer each tensor was saved
with (scale and zero point, or per-channel scales, zero points and axis)
become a real quantized tensor only here, with torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InputError
from ...model import TensorMeta
from .tensordata import to_torch

_INT_REPR = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}


def to_torch_any(t: TensorMeta) -> Any:
    """``to_torch``, quantized tensors included (rebuilt from their integer data and quantizer)."""
    if t.quantizer is None:
        return to_torch(t)
    import torch

    int_name = _INT_REPR.get(t.dtype)
    if int_name is None:
        raise InputError(f"tensor {t.key!r}: a {t.dtype} tensor cannot be rebuilt for loading here")
    ints = to_torch(TensorMeta(t.key, int_name, t.shape, t.stride, t.storage_offset, t.storage, t.device))
    q = t.quantizer
    if len(q) == 3:
        return torch._make_per_tensor_quantized_tensor(ints.contiguous(), float(q[1]), int(q[2]))
    scales = to_torch(q[1]) if isinstance(q[1], TensorMeta) else torch.tensor(q[1], dtype=torch.float64)
    zeros = to_torch(q[2]) if isinstance(q[2], TensorMeta) else torch.tensor(q[2], dtype=torch.int64)
    return torch._make_per_channel_quantized_tensor(ints.contiguous(), scales, zeros, int(q[3]))


def packed_layout(state: Mapping[str, Any]) -> dict[str, int]:
    """key -> tuple length of every packed params entry in a module's own state_dict."""
    from .packed import packed_items

    out = {}
    for key, value in state.items():
        if packed_items(key, value) is not None or (key.endswith("_packed_params") and isinstance(value, tuple)):
            out[key] = len(value)
    return out


def torch_state(actual: Mapping[str, TensorMeta], layout: Mapping[str, int]) -> dict[str, Any]:
    """The state_dict to load: real tensors, the members of each packed entry in ``layout`` as its tuple."""
    members = {f"{key}.{i}": key for key, n in layout.items() for i in range(n)}
    state: dict[str, Any] = {}
    groups: dict[str, list[Any]] = {}
    for key, meta in actual.items():
        group = members.get(key)
        if group is None:
            state[key] = to_torch_any(meta)
            continue
        groups.setdefault(group, [None] * layout[group])[int(key.rsplit(".", 1)[1])] = to_torch_any(meta)
    for key, items in groups.items():
        state[key] = tuple(items)
    return state


def flat_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A torch state_dict with packed params tuples spread into ``KEY.i`` entries (None items left out)."""
    from .packed import packed_items

    out: dict[str, Any] = {}
    for key, value in state.items():
        packed = packed_items(key, value)
        if packed is not None:
            out.update(packed)
        else:
            out[key] = value
    return out


def load_extras(mapping: Any) -> tuple[dict[str, Any], Any]:
    """(non-tensor entries a module's loader reads, ``_metadata``) of a re-read torch state_dict.

    A quantized Linear reads ``PREFIX._packed_params.dtype`` (a torch dtype)
    and, through the module versions in ``_metadata``, which layout its
    entries have; torch.load hands both to load_state_dict, so the check does too.
    """
    import torch

    from ...pickles.unpickle import DTypeRef

    if not isinstance(mapping, Mapping):
        return {}, None
    extras = {str(k): getattr(torch, v.name) for k, v in mapping.items() if isinstance(v, DTypeRef)}
    return extras, getattr(mapping, "_metadata", None)


def value_bytes(x: Any) -> bytes:
    """A CPU tensor's exact content: its bytes, and for a quantized one its integer data and quantizer."""
    import torch

    if x.is_quantized:
        parts = [value_bytes(x.int_repr()), str(x.qscheme()).encode()]
        if x.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            parts += [repr(float(x.q_scale())).encode(), repr(int(x.q_zero_point())).encode()]
        else:
            parts += [value_bytes(x.q_per_channel_scales()), value_bytes(x.q_per_channel_zero_points()),
                      repr(int(x.q_per_channel_axis())).encode()]
        return b"|".join(parts)
    x = x.contiguous()
    return x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""
