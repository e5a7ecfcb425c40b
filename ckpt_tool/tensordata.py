"""Reading tensor bytes: the only paths that touch data (stats, values, migrate, gate).

Contiguous tensors are one pread of their byte range; strided views are
gathered with torch, imported only here and only then.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from .errors import InputError
from .model import TensorMeta

if TYPE_CHECKING:
    import torch


def tensor_bytes(t: TensorMeta) -> bytes:
    """The tensor's elements in C order, as raw little-endian bytes."""
    if t.storage is None:
        raise InputError(f"tensor {t.key!r} has no data (saved on the meta device?)")
    if t.numel == 0:
        return b""
    itemsize = t.itemsize
    if t.is_contiguous:
        return t.storage.source.read(t.storage.key, t.storage_offset * itemsize, t.nbytes)
    return bytes(_gather(t).contiguous().view(_torch().uint8).numpy())


def _torch() -> Any:
    import torch

    return torch


def torch_dtype(name: str) -> torch.dtype:
    return getattr(_torch(), name)


def _gather(t: TensorMeta) -> torch.Tensor:
    """A strided view materialised from the bytes it spans."""
    torch = _torch()
    start, end = t.byte_span
    assert t.storage is not None
    raw = bytearray(t.storage.source.read(t.storage.key, start, end - start))
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(torch_dtype(t.dtype))
    stride = t.stride or ()
    return torch.as_strided(flat, t.shape, stride, 0)


def to_torch(t: TensorMeta) -> torch.Tensor:
    """A CPU torch tensor holding the data (a fresh copy, safe to modify)."""
    torch = _torch()
    dtype = torch_dtype(t.dtype)
    if t.numel == 0:
        return torch.empty(t.shape, dtype=dtype)
    if t.is_contiguous:
        raw = bytearray(tensor_bytes(t))
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(t.shape)
    return _gather(t).clone()


def iter_chunks(t: TensorMeta, elements: int) -> Iterator[torch.Tensor]:
    """The elements in C order as flat CPU tensors of at most ``elements`` each.

    A contiguous tensor is read one byte range per chunk, so memory stays at
    one chunk whatever the tensor's size (value diff of multi-GB tensors);
    a strided view is gathered whole and then sliced.
    """
    torch = _torch()
    dtype = torch_dtype(t.dtype)
    if t.numel == 0:
        return
    if not t.is_contiguous:
        flat = _gather(t).contiguous().reshape(-1)  # a view of a view can stay strided
        for start in range(0, t.numel, elements):
            yield flat[start:start + elements]
        return
    if t.storage is None:
        raise InputError(f"tensor {t.key!r} has no data (saved on the meta device?)")
    itemsize = t.itemsize
    base = t.storage_offset * itemsize
    for start in range(0, t.numel, elements):
        count = min(elements, t.numel - start)
        raw = bytearray(t.storage.source.read(t.storage.key, base + start * itemsize, count * itemsize))
        yield torch.frombuffer(raw, dtype=torch.uint8).view(dtype)
