"""Values of the dtypes torch has no arithmetic for, in a dtype it can compare (``diff --values``).

torch 2.13 has no ``==``, no cast and no ``abs`` for the bits types, no cast
for ``float4_e2m1fn_x2``, and a quantized tensor's stored integers mean
nothing without its scale and zero point. closeness.compare_pair reads such
tensors through here:

- bits types: their bit patterns, viewed as the unsigned integer of the same
  width (dtypes.DType.compare_as); equal means bit for bit equal; the
  sub-byte integers int1..int7/uint1..uint7 (which torch.load reads but
  torch.save refuses) as the int8/uint8 byte each element takes;
- float4_e2m1fn_x2: both fp4 values of each byte decoded exactly into
  float32 (low nibble first), so a pair holds twice as many values as torch's
  numel counts; e2m1fn has no NaN and no Inf;
- quantized tensors (every scheme and width, quint4x2/quint2x4 included):
  rebuilt by torch's own ``_rebuild_qtensor`` from the storage bytes and the
  quantizer the file holds, then dequantized to float32, so two files with
  the same integers under different scales differ.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ... import dtypes
from ...errors import InputError
from ...model import TensorMeta

if TYPE_CHECKING:
    import torch

# e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; codes 0-7 positive, 8-15 their negatives
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def needs_values(dtype: str) -> bool:
    """True when compare_pair must read this dtype's values through ``comparable`` (not iter_chunks)."""
    dt = dtypes.lookup(dtype)
    return dt.compare_as is not None or dt.kind == "quantized" or dt.safetensors_per_item != 1


def compared_dtype(dtype: str) -> str:
    """The dtype ``comparable`` hands back for ``dtype``."""
    dt = dtypes.lookup(dtype)
    if dt.compare_as is not None:
        return dt.compare_as
    return "float32" if needs_values(dtype) else dt.name


def compared_numel(t: TensorMeta) -> int:
    """How many values ``comparable_chunks`` yields for ``t`` (float4_e2m1fn_x2: two a byte)."""
    return t.numel * dtypes.lookup(t.dtype).safetensors_per_item


def comparable(t: TensorMeta) -> torch.Tensor:
    """The tensor's values as one flat CPU tensor of ``compared_dtype(t.dtype)`` (read whole: inspect --stats)."""
    import torch

    from ..data import torch_dtype

    parts = list(comparable_chunks(t, max(t.numel, 1)))  # one chunk: the whole tensor
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch_dtype(compared_dtype(t.dtype)))


def comparable_chunks(t: TensorMeta, elements: int) -> Iterator[torch.Tensor]:
    """The values of ``elements`` tensor elements at a time, in C order, as flat CPU tensors of
    ``compared_dtype(t.dtype)``: bits and float4 converted chunk by chunk as they are read (a multi-GB
    float4 tensor never sits in memory as float32 whole); quantized ones rebuilt whole, then sliced."""
    import torch

    from ..data import iter_chunks, torch_dtype

    dt = dtypes.lookup(t.dtype)
    if dt.kind == "quantized":
        x = _dequantized(t).reshape(-1)
        for start in range(0, x.numel(), elements):
            yield x[start:start + elements]
        return
    table = torch.tensor(FP4_E2M1, dtype=torch.float32)
    for x in iter_chunks(t, elements):
        if dt.compare_as is not None:
            yield x.view(torch.uint8).view(torch_dtype(dt.compare_as))
        elif dt.safetensors_per_item != 1:  # float4_e2m1fn_x2: two codes a byte, low nibble first
            codes = x.view(torch.uint8)
            yield table[torch.stack([codes & 0x0F, codes >> 4], dim=-1).reshape(-1).int()]
        else:
            yield x


def _dequantized(t: TensorMeta) -> torch.Tensor:
    """torch.load's own rebuild of a quantized tensor (torch._utils._rebuild_qtensor), dequantized."""
    import torch

    from ..data import to_torch, torch_dtype

    q, storage = t.quantizer, t.storage
    if q is None or storage is None or not q or not hasattr(torch, str(q[0])):
        raise InputError(f"tensor {t.key!r} is {t.dtype} without a quantizer ckpt can rebuild")
    raw = bytearray(storage.source.read(storage.key, 0, storage.nbytes))
    untyped = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage() if raw else torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
    typed = torch.storage.TypedStorage(  # type: ignore[no-untyped-call]
        wrap_storage=untyped, dtype=torch_dtype(t.dtype), _internal=True)
    params: tuple[Any, ...] = (getattr(torch, str(q[0])),)
    if len(q) == 3:  # per tensor: scale, zero point
        params += (float(q[1]), int(q[2]))
    else:  # per channel: scales and zero points are tensors of their own, then the axis
        scales = to_torch(q[1]) if isinstance(q[1], TensorMeta) else torch.tensor(q[1], dtype=torch.float64)
        zeros = to_torch(q[2]) if isinstance(q[2], TensorMeta) else torch.tensor(q[2], dtype=torch.int64)
        params += (scales, zeros, int(q[3]))
    stride = t.stride if t.stride is not None else t.strides
    try:
        x: torch.Tensor = torch._utils._rebuild_qtensor(  # type: ignore[no-untyped-call]
            typed, t.storage_offset, t.shape, stride, params, False, None)
    except (RuntimeError, ValueError, TypeError) as exc:  # torch's own refusal of a malformed quantizer
        raise InputError(f"tensor {t.key!r}: torch cannot rebuild this {t.dtype} tensor ({exc})") from None
    return x.dequantize()
