"""What every writer consumes: output tensors that point at their source bytes.

An ``OutTensor`` is one entry of the output state_dict: its new key, the
source tensor it comes from and the dtype it is written in. Its bytes are
read from the source only while it is written (and again when verified):

- small tensors that lie near each other in the source file are read with
  one ``pread`` per block of up to ``CHUNK`` bytes (a 200,000-tensor file
  costs hundreds of reads, not 200,000);
- large contiguous tensors are copied a chunk at a time;
- casts and strided views are built whole (with torch), one tensor at a time.

So memory stays near one chunk, or one tensor for casts and strided views.
"""
from __future__ import annotations

import errno
import os
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from math import prod
from typing import Any, NamedTuple

from .. import dtypes
from ..errors import InputError
from ..io.source import FileSource, pread_exact
from ..model import StorageRef, TensorMeta, contiguous_strides
from ..tensors.tensordata import tensor_bytes

CHUNK = 4 << 20  # bytes per read/write: large enough for disk speed, small enough to stay in cache
_BIG = 1 << 20  # tensors at least this large are streamed on their own
_GAP = 1 << 20  # bytes of other data a coalesced read may skip over
_BY_NAME = dtypes.BY_NAME


def _iov_max() -> int:
    try:
        return max(1, min(os.sysconf("SC_IOV_MAX"), 1024))
    except (AttributeError, ValueError, OSError):
        return 16  # unknown platform limit: small batches are always accepted


_IOV_MAX = _iov_max()


class OutTensor:
    """One tensor of the output: ``key`` in ``dtype``, holding ``source``'s values.

    A plain __slots__ class with its sizes computed once: migrate makes one
    per tensor and reads these fields several times each.
    """

    __slots__ = ("key", "source", "dtype", "shape", "numel", "nbytes", "cast", "streamable", "itemsize", "_view",
                 "_loc")

    def __init__(self, key: str, source: TensorMeta, dtype: str) -> None:
        self.key = key
        self.source = source
        self.dtype = dtype
        self.shape = source.shape
        self.numel = numel = prod(source.shape)
        out_dt = _BY_NAME.get(dtype) or dtypes.lookup(dtype)
        self.nbytes = numel * out_dt.itemsize
        self.cast = dtype != source.dtype
        # element size in the source (offsets into its storage are counted in these)
        self.itemsize = (_BY_NAME.get(source.dtype) or dtypes.lookup(source.dtype)).itemsize if self.cast \
            else out_dt.itemsize
        # True when the bytes can be copied straight from the source
        self.streamable = not self.cast and source.storage is not None and source.is_contiguous
        self._view: object = False
        self._loc: object = False  # small_location's answer, once asked (writing and verifying both ask)

    def view_key(self) -> tuple[object, ...] | None:
        """Identity of the exact values: equal keys mean the same view of the same storage."""
        if self._view is False:
            s = self.source
            if s.storage is None:
                self._view = None
            else:
                stride = s.stride if s.stride is not None else contiguous_strides(s.shape)
                self._view = (id(s.storage.source), s.storage.key, s.dtype, s.storage_offset, s.shape,
                              stride if self.numel > 1 else None, self.dtype)
        return self._view  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"OutTensor({self.key!r} <- {self.source.key!r}, {self.dtype}{list(self.shape)})"


def cast_bytes(meta: TensorMeta, dtype: str) -> bytes:
    """The tensor's values converted to ``dtype`` (torch is imported only here)."""
    import torch

    from ..tensors.tensordata import to_torch

    x = to_torch(meta).to(getattr(torch, dtypes.lookup(dtype).name)).contiguous()
    if x.numel() == 0:
        return b""
    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


def out_bytes(t: OutTensor) -> bytes:
    """All of ``t``'s output bytes, C-contiguous and little-endian."""
    if t.cast:
        return cast_bytes(t.source, t.dtype)
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

    With ``regions``, large tensors that are plain byte ranges of a file come
    as a Region instead of bytes. The pieces of one tensor must be consumed
    before asking for the next.
    """
    for i, data in coalesced([small_location(t) for t in tensors], [t.nbytes for t in tensors]):
        t = tensors[i]
        if data is not None:
            yield t, (data,)
        elif t.nbytes <= CHUNK:
            yield t, (out_bytes(t),)
        elif regions and t.streamable and t.source.storage is not None \
                and _in_files(t.source.storage, t.source.storage_offset * t.itemsize, t.nbytes):
            yield t, Region(t.source.storage, t.source.storage_offset * t.itemsize, t.nbytes)
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


def _kernel_copy(src_fd: int, dst_fd: int, offset: int, length: int, on_bytes: Callable[[int], None] | None) -> int:
    """Bytes copied with copy_file_range (no trip through user space); 0 where unsupported."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None:
        return 0
    done = 0
    while done < length:
        try:
            n = copy(src_fd, dst_fd, min(length - done, 64 << 20), offset + done)
        except OSError as exc:
            if exc.errno in _NO_KERNEL_COPY:
                return done  # the rest goes through user space
            raise
        if n == 0:
            return done
        done += n
        if on_bytes is not None:
            on_bytes(n)
    return done


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF}


def _file_pieces(ref: StorageRef, offset: int, length: int) -> list[Any] | None:
    """The (FileSource, key, offset, length) pieces of a storage made of file regions (a consolidated
    DeepSpeed or DCP tensor: formats/segments.py), or None."""
    get = getattr(ref.source, "file_pieces", None)
    return get(ref.key, offset, length) if get is not None else None


def _in_files(ref: StorageRef, offset: int, length: int) -> bool:
    """Whether these bytes are regions of plain files, which a writer may copy inside the kernel."""
    return type(ref.source) is FileSource or _file_pieces(ref, offset, length) is not None


def copy_region(out: Output, region: Region, *, crc: bool = False,
                on_bytes: Callable[[int], None] | None = None, crc_start: int = 0) -> int:
    """Append ``region`` to ``out``: in the kernel where possible; returns its CRC32 when asked (else 0).

    The CRC is computed by a second thread reading the same bytes while the
    kernel copies them (zlib and copy_file_range both release the GIL);
    ``crc_start`` continues a CRC begun on earlier bytes.
    """
    out.flush()
    ref = region.ref
    if type(ref.source) is not FileSource:  # a tensor made of file regions: each copied in turn
        value = crc_start
        for piece in _file_pieces(ref, region.offset, region.length) or ():
            value = copy_region(out, Region(StorageRef(piece.source, piece.key, piece.offset + piece.length),
                                            piece.offset, piece.length), crc=crc, on_bytes=on_bytes, crc_start=value)
        return value if crc else 0
    source = ref.source
    start, size = source.region(ref.key)  # type: ignore[attr-defined]
    if region.offset + region.length > size:
        source.read(ref.key, region.offset, region.length)  # raises the reader's own error
    src_fd = source.fd()  # type: ignore[attr-defined] # opened here, before a second thread could race to open it
    result: dict[str, Any] = {"crc": crc_start}
    stop = threading.Event()
    worker = None
    if crc:
        def checksum() -> None:
            value = crc_start
            try:
                for piece in region.chunks():
                    if stop.is_set():
                        return
                    value = zlib.crc32(piece, value)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises it
                result["error"] = exc
                return
            result["crc"] = value

        worker = threading.Thread(target=checksum, name="ckpt-crc", daemon=True)
        worker.start()
    try:
        done = _kernel_copy(src_fd, out.fd, start + region.offset, region.length, on_bytes)
        if done < region.length:
            for piece in stream_region(ref, region.offset + done, region.length - done):
                write_all(out.fd, piece)
                if on_bytes is not None:
                    on_bytes(len(piece))
    except BaseException:
        stop.set()
        raise
    finally:
        if worker is not None:
            worker.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    out.pos += region.length
    return result["crc"]  # type: ignore[return-value]


def require_data(t: OutTensor) -> None:
    if t.source.storage is None:
        raise InputError(f"tensor {t.source.key!r} holds no data (it was saved on the meta device); "
                         "drop it with --drop or choose another source")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> int:
    """os.write until every byte is written (regular files rarely write short, but may)."""
    view = memoryview(data)
    total = len(view)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    return total


class Output:
    """Sequential writes to a file descriptor, small ones gathered into one ``writev``.

    Buffers that their producer reuses (bytearray, memoryview) are written at
    once, never held.
    """

    def __init__(self, fd: int, flush_at: int = CHUNK) -> None:
        self.fd = fd
        self.pos = 0  # bytes accepted so far (written or buffered)
        self._parts: list[bytes] = []
        self._buffered = 0
        self._flush_at = flush_at

    def write(self, data: bytes | bytearray | memoryview) -> None:
        n = len(data)
        if n >= self._flush_at or type(data) is not bytes:
            self.flush()
            write_all(self.fd, data)
        else:
            self._parts.append(data)
            self._buffered += n
            if self._buffered >= self._flush_at:
                self.flush()
        self.pos += n

    def flush(self) -> None:
        parts = self._parts
        if not parts:
            return
        if len(parts) == 1:
            write_all(self.fd, parts[0])
        else:
            for i in range(0, len(parts), _IOV_MAX):
                batch = parts[i:i + _IOV_MAX]
                total = sum(map(len, batch))
                n = os.writev(self.fd, batch)
                if n != total:  # a short writev: finish the rest plainly
                    write_all(self.fd, b"".join(batch)[n:])
        parts.clear()
        self._buffered = 0
