"""What every writer consumes: output tensors that point at their source bytes.

An ``OutTensor`` is one entry of the output state_dict: its new key, the
source tensor it comes from and the dtype it is written in. Its bytes are
read from the source only while it is written (and again when verified), a
chunk at a time where the layout allows, so memory stays near one chunk or,
for casts and strided views, one tensor.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from .. import dtypes
from ..errors import InputError
from ..model import StorageRef, TensorMeta, contiguous_strides
from ..tensordata import tensor_bytes

CHUNK = 16 << 20  # bytes per read/write: large enough for disk speed, small enough for memory


@dataclass(frozen=True)
class OutTensor:
    """One tensor of the output: ``key`` in ``dtype``, holding ``source``'s values."""

    key: str
    source: TensorMeta
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape

    @property
    def numel(self) -> int:
        return self.source.numel

    @property
    def cast(self) -> bool:
        return self.dtype != self.source.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * dtypes.lookup(self.dtype).itemsize

    @property
    def streamable(self) -> bool:
        """True when the bytes can be copied straight from the source, chunk by chunk."""
        return not self.cast and self.source.is_contiguous and self.source.storage is not None

    def view_key(self) -> tuple[object, ...] | None:
        """Identity of the exact values: equal keys mean the same view of the same storage."""
        s = self.source
        if s.storage_id is None:
            return None
        stride = s.stride if s.stride is not None else contiguous_strides(s.shape)
        return (s.storage_id, s.dtype, s.storage_offset, s.shape, stride if s.numel > 1 else None, self.dtype)


def cast_bytes(meta: TensorMeta, dtype: str) -> bytes:
    """The tensor's values converted to ``dtype`` (torch is imported only here)."""
    import torch

    from ..tensordata import to_torch

    x = to_torch(meta).to(getattr(torch, dtypes.lookup(dtype).name)).contiguous()
    if x.numel() == 0:
        return b""
    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


def out_bytes(t: OutTensor) -> bytes:
    """All of ``t``'s output bytes, C-contiguous and little-endian."""
    if t.cast:
        return cast_bytes(t.source, t.dtype)
    return tensor_bytes(t.source)


def out_chunks(t: OutTensor, chunk: int = CHUNK) -> Iterator[bytes]:
    """``t``'s output bytes in pieces of at most ``chunk`` bytes (one piece when it must be built whole)."""
    if not t.streamable or t.nbytes <= chunk:
        data = out_bytes(t)
        if data:
            yield data
        return
    s = t.source
    assert s.storage is not None  # streamable guarantees it
    start = s.storage_offset * s.itemsize
    for off in range(0, t.nbytes, chunk):
        yield s.storage.source.read(s.storage.key, start + off, min(chunk, t.nbytes - off))


def storage_chunks(ref: StorageRef, chunk: int = CHUNK) -> Iterator[bytes]:
    """A whole source storage, in pieces."""
    for off in range(0, ref.nbytes, chunk):
        yield ref.source.read(ref.key, off, min(chunk, ref.nbytes - off))


def require_data(t: OutTensor) -> None:
    if t.source.storage is None:
        raise InputError(f"tensor {t.source.key!r} holds no data (it was saved on the meta device); "
                         "drop it with --drop or choose another source")


def write_all(fd: int, data: bytes | memoryview) -> int:
    """os.write until every byte is written (regular files rarely write short, but may)."""
    view = memoryview(data)
    total = len(view)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    return total
