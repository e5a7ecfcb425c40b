"""Reading the output tensors' bytes from their sources, with few reads and little memory.

- small tensors that lie near each other in the source file are read with
  one ``pread`` per block of up to ``CHUNK`` bytes (a 200,000-tensor file
  costs hundreds of reads, not 200,000);
- large contiguous tensors are copied a chunk at a time, or handed over as a
  ``Region`` that output.py copies inside the kernel;
- casts and strided views are built whole (with torch), one tensor at a time.

So memory stays near one chunk, or one tensor for casts and strided views.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ..errors import InputError
from ..io import FileSource, pread_exact
from ..model import StorageRef, TensorMeta
from ..tensors.data import tensor_bytes
from ..tensors.numerics import cast_to_bytes
from .base import CHUNK, OutTensor

_BIG = 1 << 20  # tensors at least this large are streamed on their own
_GAP = 1 << 20  # bytes of other data a coalesced read may skip over


def cast_bytes(meta: TensorMeta, dtype: str) -> bytes:
    """The tensor's values converted to ``dtype`` (the torch adapter casts: tensors/castloss.py)."""
    return cast_to_bytes(meta, dtype)[0]


def out_bytes(t: OutTensor) -> bytes:
    """All of ``t``'s output bytes, C-contiguous and little-endian.

    A cast counts what it did to the values the first time (``t.loss``), in
    the same pass that converts them; re-computing it (verification) does
    not count again.
    """
    if t.cast:
        data, loss = cast_to_bytes(t.source, t.dtype, count=t.loss is None)
        if t.loss is None:
            t.loss = loss
        return data
    return tensor_bytes(t.source)


def out_chunks(t: OutTensor, chunk: int = CHUNK) -> Iterator[bytes | bytearray]:
    """``t``'s output bytes in pieces of at most ``chunk`` bytes (one piece when it must be built whole).

    A streamed piece may be a buffer that the next piece overwrites: use it
    (write it, hash it, compare it) before asking for the next.
    """
    s = t.source
    if not t.streamable or t.nbytes <= chunk or s.storage is None:
        data = out_bytes(t)
        if data:
            yield data
        return
    yield from stream_region(s.storage, s.storage_offset * t.itemsize, t.nbytes, chunk)


def stream_region(ref: StorageRef, offset: int, length: int, chunk: int = CHUNK) -> Iterator[bytes | bytearray]:
    """``length`` bytes of a storage from ``offset``, read into one reused buffer.

    Full pieces are the buffer itself (a fresh allocation per piece costs a
    page fault per 4 KiB, which dominated copying); the last, shorter piece
    is a copy. Sources other than plain files are read the ordinary way.
    """
    source = ref.source
    if type(source) is not FileSource:
        for off in range(0, length, chunk):
            yield source.read(ref.key, offset + off, min(chunk, length - off))
        return
    start, size = source.region(ref.key)
    if offset < 0 or offset + length > size:
        source.read(ref.key, offset, length)  # raises the reader's own out-of-bounds error
    fd = source.fd()
    buf = bytearray(min(chunk, length))
    view = memoryview(buf)
    pos = start + offset
    left = length
    while left:
        want = min(len(buf), left)
        got = 0
        while got < want:
            n = os.preadv(fd, [view[got:want]], pos + got)
            if n <= 0:
                raise InputError(f"truncated: needed {want} bytes at offset {pos}, the file ends first", source.path)
            got += n
        yield buf if want == len(buf) else bytes(view[:want])
        pos += want
        left -= want


def file_location(meta: TensorMeta, begin: int, nbytes: int) -> tuple[FileSource, int] | None:
    """(file, absolute offset) of ``nbytes`` bytes at ``begin`` in ``meta``'s storage.

    None when the storage is not a region of a plain file, or is shorter
    (whoever reads it the other way raises the reader's own error).
    """
    ref = meta.storage
    if ref is None or type(ref.source) is not FileSource:
        return None
    start, size = ref.source.region(ref.key)
    return None if begin + nbytes > size else (ref.source, start + begin)


def small_location(t: OutTensor) -> tuple[FileSource, int] | None:
    """file_location of a small streamable tensor (asked once per tensor), or None when it is read another way."""
    found = t._loc
    if found is False:
        small = t.streamable and t.nbytes < _BIG
        found = t._loc = file_location(t.source, t.source.storage_offset * t.itemsize, t.nbytes) if small else None
    return found  # type: ignore[return-value]


def _storage_location(ref: StorageRef) -> tuple[FileSource, int] | None:
    if ref.nbytes >= _BIG or type(ref.source) is not FileSource:
        return None
    start, size = ref.source.region(ref.key)
    return (ref.source, start) if ref.nbytes <= size else None


def coalesced(locs: Sequence[tuple[FileSource, int] | None],
              sizes: Sequence[int]) -> Iterator[tuple[int, bytes | None]]:
    """(index, bytes) for every located item, neighbours read together; (index, None) for the others.

    Items are visited in order; a read covers up to ``CHUNK`` bytes of one
    file and may skip small gaps (zip headers between torch storages).
    """
    i, n = 0, len(locs)
    while i < n:
        loc = locs[i]
        if loc is None:
            yield i, None
            i += 1
            continue
        source, start = loc
        end = start + sizes[i]
        j = i + 1
        while j < n:
            nxt = locs[j]
            if nxt is None or nxt[0] is not source:
                break
            at = nxt[1]
            if at < end or at - end > _GAP or at + sizes[j] - start > CHUNK:
                break
            end = at + sizes[j]
            j += 1
        if j == i + 1:
            yield i, None
        else:
            block = pread_exact(source.fd(), end - start, start, source.path)
            for k in range(i, j):
                rel = locs[k][1] - start  # type: ignore[index]
                yield k, block[rel:rel + sizes[k]]
        i = j


class Region(NamedTuple):
    """A large run of bytes in a source file, which a writer may copy inside the kernel."""

    ref: StorageRef
    offset: int
    length: int

    def chunks(self) -> Iterator[bytes | bytearray]:
        return stream_region(self.ref, self.offset, self.length)


def tensor_data(tensors: Sequence[OutTensor], *, regions: bool = False
                ) -> Iterator[tuple[OutTensor, Iterable[bytes | bytearray] | Region]]:
    """Each tensor with its bytes, in order; neighbouring small tensors share one read.

    With ``regions``, tensors from 1 MiB that are byte ranges of files come
    as a Region instead of bytes. The pieces of one tensor must be consumed
    before asking for the next.
    """
    for i, data in coalesced([small_location(t) for t in tensors], [t.nbytes for t in tensors]):
        t = tensors[i]
        if data is not None:
            yield t, (data,)
        elif regions and t.nbytes >= _BIG and t.streamable and t.source.storage is not None \
                and _in_files(t.source.storage, t.source.storage_offset * t.itemsize, t.nbytes):
            # from 1 MiB the kernel copies it: a tensor of a consolidated run is several file ranges, which
            # read and joined here would cross user space twice (ZeRO-3: a fifth of the output, 3x the cost)
            yield t, Region(t.source.storage, t.source.storage_offset * t.itemsize, t.nbytes)
        elif t.nbytes <= CHUNK:
            yield t, (out_bytes(t),)
        else:
            yield t, out_chunks(t)


def storage_data(refs: Sequence[StorageRef], *, regions: bool = False
                 ) -> Iterator[Iterable[bytes | bytearray] | Region]:
    """The bytes of whole storages, in order, neighbours read together (large ones as Regions if asked)."""
    for i, data in coalesced([_storage_location(r) for r in refs], [r.nbytes for r in refs]):
        ref = refs[i]
        if data is not None:
            yield (data,)
        elif ref.nbytes <= CHUNK:
            yield (ref.source.read(ref.key, 0, ref.nbytes),)
        elif regions and _in_files(ref, 0, ref.nbytes):
            yield Region(ref, 0, ref.nbytes)
        else:
            yield stream_region(ref, 0, ref.nbytes)


def file_pieces(ref: StorageRef, offset: int, length: int) -> list[Any] | None:
    """The (FileSource, key, offset, length) pieces of a storage made of file regions (a consolidated
    DeepSpeed or DCP tensor: io/segments.py), or None."""
    get = getattr(ref.source, "file_pieces", None)
    return get(ref.key, offset, length) if get is not None else None


def _in_files(ref: StorageRef, offset: int, length: int) -> bool:
    """Whether these bytes are regions of plain files, which a writer may copy inside the kernel."""
    return type(ref.source) is FileSource or file_pieces(ref, offset, length) is not None
