"""The one NaN/Inf counter, and the counts of whole tensors read at about the speed of the file.

Each chunk is bit-tested first (tensordata.all_finite, no torch); only a
chunk that holds a NaN or Inf is counted, with torch (tensor_nonfinite,
which widens float8 first: torch has no isinf kernel for float8_e4m3fn).
Users: ``ckpt gate``'s no_nan_inf check, ``inspect --stats``
(tensors/stats.py), ``diff --values`` (closeness.py) and migrate's cast
check (castloss.py).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...model import TensorMeta

if TYPE_CHECKING:
    import torch

_CHUNK = 4 << 20  # bytes of a contiguous tensor checked for NaN/Inf at a time (tensordata.RAW_CHUNK)


def nonfinite_counts(tensors: list[TensorMeta]) -> Iterator[tuple[TensorMeta, int, int]]:
    """(tensor, NaN count, Inf count) per tensor, in order.

    Contiguous tensors are read chunk by chunk by worker threads, one per
    core, each bit-testing the chunk it read (tensordata.check_reads), so the
    check runs at about the speed of reading the file.
    """
    from ..data import all_finite, check_reads, group_reads

    # Small tensors (200,000 of them in some files) are read in the calling thread and
    # bit-tested a batch at a time: a thread hand-off and a NumPy call per tensor cost more
    # than reading it. A batch that holds a NaN or Inf is counted tensor by tensor.
    small = {id(t): t for t in tensors if t.is_contiguous and 0 < t.nbytes < _SMALL_TENSOR}
    small_counts = _small_nonfinite_counts(list(small.values()))
    streamed = [t for t in tensors if t.is_contiguous and t.numel and id(t) not in small]
    reads, owner = group_reads([(t,) for t in streamed], _CHUNK)

    def check(i: int, raw: Any) -> tuple[int, int]:
        dtype = streamed[owner[i]].dtype
        return (0, 0) if all_finite(raw, dtype) else _count_chunk(raw, dtype)

    chunks = check_reads(reads, check, chunk_bytes=_CHUNK)
    counts = Counter(owner)  # chunks per streamed tensor
    done = 0  # streamed tensors counted so far
    try:
        for t in tensors:
            if id(t) in small:
                yield (t, *small_counts[id(t)])
                continue
            if not (t.is_contiguous and t.numel):
                yield (t, *count_nonfinite(t))  # a strided view is gathered whole; an empty one holds nothing
                continue
            nan = inf = 0
            for _ in range(counts[done]):
                n, i = next(chunks)
                nan, inf = nan + n, inf + i
            done += 1
            yield t, nan, inf
    finally:
        chunks.close()


_SMALL_TENSOR = 256 << 10  # bytes: smaller contiguous tensors are checked in batches


def _small_nonfinite_counts(tensors: list[TensorMeta]) -> dict[int, tuple[int, int]]:
    """id(tensor) -> (NaN count, Inf count) for small contiguous tensors, batched by dtype."""
    from ..data import all_finite, tensor_bytes

    out: dict[int, tuple[int, int]] = {}
    by_dtype: dict[str, list[TensorMeta]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype, group in by_dtype.items():
        start = 0
        while start < len(group):
            batch: list[TensorMeta] = []
            size = 0
            while start < len(group) and (not batch or size < _CHUNK):
                batch.append(group[start])
                size += group[start].nbytes
                start += 1
            raws = [tensor_bytes(t) for t in batch]
            if all_finite(b"".join(raws), dtype):
                out.update((id(t), (0, 0)) for t in batch)
            else:
                for t, raw in zip(batch, raws, strict=True):
                    out[id(t)] = (0, 0) if all_finite(raw, dtype) else _count_chunk(raw, dtype)
    return out


def _count_chunk(raw: Any, dtype: str) -> tuple[int, int]:
    """(NaN count, Inf count) of raw little-endian ``dtype`` values (count_raw_nonfinite)."""
    return count_raw_nonfinite(raw, dtype)


def tensor_nonfinite(x: torch.Tensor) -> tuple[int, int]:
    """(NaN count, Inf count) of a torch tensor: the one counter every other count goes through.

    Integers and bools hold neither. float8 values are widened to float32
    first: torch has no isinf/isfinite kernels for float8_e4m3fn (isnan
    alone works), and the widening is exact, so NaN stays NaN and Inf Inf.
    """
    import torch

    if not (x.dtype.is_floating_point or x.is_complex()) or x.dtype == torch.float4_e2m1fn_x2:
        return 0, 0  # float4_e2m1fn_x2: no NaN, no Inf (and no cast to widen it with)
    if x.dtype.is_floating_point and x.element_size() == 1:
        x = x.to(torch.float32)
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def count_raw_nonfinite(raw: Any, dtype: str) -> tuple[int, int]:
    """(NaN count, Inf count) of raw little-endian ``dtype`` values.

    The bit test (tensordata.all_finite) answers most chunks without torch;
    only a chunk that holds a NaN or Inf is counted, with torch (tensor_nonfinite).
    """
    from ..data import all_finite, torch_dtype

    if all_finite(raw, dtype) is not False:
        return 0, 0
    import torch

    return tensor_nonfinite(torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch_dtype(dtype)))


def count_nonfinite(t: TensorMeta, buffer: bytearray | None = None) -> tuple[int, int]:
    """(NaN count, Inf count), reading a contiguous tensor in chunks, a strided one whole.

    Each chunk is first tested bit by bit (tensordata.all_finite: ~5 GB/s, no
    torch import); only a chunk that holds a NaN or Inf is counted with torch
    (torch.isfinite runs at ~0.4 GB/s).
    """
    from ..data import all_finite, iter_raw

    nan = inf = 0
    if buffer is None or len(buffer) < min(_CHUNK, t.nbytes):
        buffer = bytearray(min(_CHUNK, t.nbytes))
    for raw in iter_raw(t, _CHUNK, buffer):
        if not all_finite(raw, t.dtype):
            n, i = _count_chunk(raw, t.dtype)
            nan, inf = nan + n, inf + i
    return nan, inf
