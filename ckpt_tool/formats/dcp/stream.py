"""DCP tensor bytes streamed from the shard files, never a whole chunk or tensor in memory.

Each chunk of a DCP tensor is a complete ``torch.save`` zip inside a
``.distcp`` file. Its small pickle is read (through a window onto the file,
with the restricted unpickler) to find where the chunk's elements lie; the
elements themselves are then byte ranges of the ``.distcp`` file. A tensor
whose chunks are each one contiguous run (FSDP2/torchtitan ``Shard(0)``,
replicated and plain tensors, Megatron's per-layer blocks) is its chunks back to back: a SegmentSource
reads any range of it straight from the files. Other splits (a ``Shard(1)``
tensor-parallel weight) are assembled once, in the tensor's own buffer,
block by block: memory is the largest such tensor plus one block.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ... import dtypes
from ...errors import InputError
from ...io import ByteSource, FileSource, RangeSource, Segment, SegmentSource, paths, storage_source
from ...io.zip import ZipArchive
from ...limits import Limits
from ...model import DataSource, contiguous_strides

_BLOCK = 16 << 20  # bytes of a chunk read at once when it is placed into an assembled tensor


@dataclass(frozen=True)
class Chunk:
    """One saved piece of a tensor: where it sits in the tensor and in which file (read from ``.metadata``)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()
    raw: bool = False  # the bytes are the elements themselves (a safetensors slice), not a torch.save zip


class _Window:
    """Bytes [start, start + length) of a file, sliced like ``bytes`` (what ZipArchive reads through)."""

    def __init__(self, fd: int | ByteSource, start: int, length: int, path: str) -> None:
        self.fd, self.start, self.length, self.path = fd, start, length, path  # a descriptor, or a URL's bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, s: slice) -> bytes:
        lo, hi, _ = s.indices(self.length)
        if hi <= lo:
            return b""
        if not isinstance(self.fd, int):
            return self.fd.read(self.start + lo, hi - lo)
        return os.pread(self.fd, hi - lo, self.start + lo)


def _regions(path: str) -> Callable[[str], tuple[int, int]]:
    """FileSource keys are "offset:length" byte ranges of the file itself."""
    def resolve(key: str) -> tuple[int, int]:
        start, length = key.split(":")
        return int(start), int(length)

    return resolve


class StreamedOrAssembled:
    """The reads of a source whose tensors are streamed from file byte ranges where ``_plan(key)`` says so
    (``_segments``), else read from the whole tensor ``_assembled(key)`` builds (DCP here, formats/ranks)."""

    path: str
    _segments: SegmentSource

    def _plan(self, key: str) -> bool:
        raise NotImplementedError

    def _assembled(self, key: str) -> bytearray:
        raise NotImplementedError

    def file_pieces(self, key: str, offset: int, length: int) -> list[Segment] | None:
        """Byte ranges of the files for a streamed tensor (writers copy them in the kernel)."""
        return self._segments.file_pieces(key, offset, length) if self._plan(key) else None

    def read(self, key: str, offset: int, length: int) -> bytes:
        if self._plan(key):
            return self._segments.read(key, offset, length)
        data = self._assembled(key)
        if offset < 0 or length < 0 or offset + length > len(data):
            raise InputError(f"tensor {key!r} holds {len(data)} bytes, not {offset + length}", self.path)
        return bytes(data[offset:offset + length])

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        if self._plan(key):
            self._segments.read_into(key, offset, out)
            return
        data = self._assembled(key)
        if offset < 0 or offset + len(out) > len(data):
            raise InputError(f"tensor {key!r} holds {len(data)} bytes, not {offset + len(out)}", self.path)
        out[:] = memoryview(data)[offset:offset + len(out)]


class DcpStreamSource(StreamedOrAssembled, DataSource):
    """Tensor bytes of a DCP folder, read as byte ranges of the shard files that hold their chunks."""

    def __init__(self, folder: str, limits: Limits) -> None:
        self.path = folder
        self.limits = limits
        self._tensors: dict[str, tuple[dtypes.DType, tuple[int, ...], list[Chunk]]] = {}
        self._segments = SegmentSource(folder)
        self._files: dict[str, FileSource | RangeSource] = {}
        self._placed: dict[str, bool] = {}  # key -> streamed (True) or assembled (False)
        self._whole: tuple[str, bytearray] | None = None

    def add(self, key: str, dt: dtypes.DType, shape: tuple[int, ...], chunks: list[Chunk]) -> None:
        self._tensors[key] = (dt, shape, chunks)

    # -- where a chunk's elements are -----------------------------------------
    def _file(self, rel: str) -> FileSource | RangeSource:
        found = self._files.get(rel)
        if found is None:
            path = paths.join(self.path, rel)
            if not paths.is_url(path) and not os.path.isfile(path):
                raise InputError(f"shard file {rel!r} is missing", self.path)
            found = self._files[rel] = storage_source(path, _regions(path))  # type: ignore[assignment]
        return found  # type: ignore[return-value]  # set just above when missing

    def chunk_segment(self, key: str, dt: dtypes.DType, chunk: Chunk) -> Segment:
        """The byte range of the shard file that holds ``chunk``'s elements in C order."""
        if chunk.transforms:
            raise InputError(f"tensor {key!r} is stored with DCP transforms {list(chunk.transforms)} "
                             "(compression?), which ckpt cannot read", self.path)
        source = self._file(chunk.relative_path)
        want = _prod(chunk.sizes) * dt.itemsize
        if chunk.raw:  # placed and checked against its file's header by its reader
            return Segment(source, f"{chunk.offset}:{want}", 0, want)
        fd: int | ByteSource = source.data if isinstance(source, RangeSource) else source.fd()
        size = os.fstat(fd).st_size if isinstance(fd, int) else fd.size
        if chunk.offset + chunk.length > size:
            raise InputError(f"a chunk of tensor {key!r} lies past the end of {chunk.relative_path!r} "
                             f"({chunk.offset + chunk.length} > {size} bytes)", self.path)
        head = os.pread(fd, 4, chunk.offset) if isinstance(fd, int) else fd.read_upto(chunk.offset, 4)
        if head != b"PK\x03\x04":
            if chunk.length == want:  # raw tensor bytes
                return Segment(source, f"{chunk.offset}:{want}", 0, want)
            raise InputError(f"the chunk of tensor {key!r} in {chunk.relative_path!r} is not torch.save bytes",
                             self.path)
        start, nbytes = self._locate(key, dt, chunk, source, fd)
        return Segment(source, f"{start}:{nbytes}", 0, want)

    def _locate(self, key: str, dt: dtypes.DType, chunk: Chunk, source: FileSource | RangeSource,
                fd: int | ByteSource) -> tuple[int, int]:
        from ...pickles import severity
        from ...pickles.unpickle import LazyTensor, restricted_loads
        from ..torchsave import archive_prefix, storage_loader

        where = f"chunk of tensor {key!r}"
        window = _Window(fd, chunk.offset, chunk.length, source.path)
        archive = ZipArchive(source.path, self.limits.max_member_bytes, data=window)  # type: ignore[arg-type]
        prefix = archive_prefix(archive)
        pkl = prefix + "data.pkl"
        if pkl not in archive.members:
            raise InputError(f"the {where} is a zip archive without {pkl!r}, not torch.save bytes", source.path)
        result = restricted_loads(archive.read(pkl, self.limits.max_pickle_bytes), where=f"{where}/{pkl}",
                                  path=source.path,
                                  persistent_load=storage_loader(archive, prefix, source, source.path),
                                  limits=self.limits)
        unsafe = sorted({r.qualname for r in result.references if r.severity != severity.SAFE})
        if unsafe:
            raise InputError(f"the {where} names {', '.join(unsafe[:3])}, not a plain tensor; refusing it",
                             source.path)
        obj = result.obj
        if not isinstance(obj, LazyTensor) or obj.storage is None:
            raise InputError(f"the {where} does not hold a tensor", source.path)
        if obj.dtype.name != dt.name or tuple(obj.shape) != chunk.sizes:
            raise InputError(f"the {where} holds {obj.dtype.name} {list(obj.shape)}, but .metadata says "
                             f"{dt.name} {list(chunk.sizes)}", source.path)
        numel = _prod(chunk.sizes)
        want = contiguous_strides(chunk.sizes)
        if numel > 1 and tuple(obj.stride) != want and \
                any(d != 1 and s != w for d, s, w in zip(chunk.sizes, obj.stride, want, strict=False)):
            raise InputError(f"the {where} is not stored contiguously", source.path)
        offset, size = archive.region(obj.storage.key)
        begin = obj.storage_offset * dt.itemsize
        if begin + numel * dt.itemsize > size:
            raise InputError(f"the {where} reaches past the end of its storage", source.path)
        return chunk.offset + offset + begin, numel * dt.itemsize

    # -- reading ----------------------------------------------------------------
    def _plan(self, key: str) -> bool:
        """Register ``key``'s segments if its chunks are consecutive row blocks; True when streamed."""
        found = self._placed.get(key)
        if found is not None:
            return found
        dt, shape, chunks = self._tensors[key]
        rows = row_order(shape, chunks)
        if rows is None:
            self._placed[key] = False
            return False
        segs = [self.chunk_segment(key, dt, c) for c in rows]
        nbytes = self._segments.add(key, [s for s in segs if s.length])
        if nbytes != _prod(shape) * dt.itemsize:
            raise InputError(f"the chunks of tensor {key!r} hold {nbytes} bytes, not {_prod(shape) * dt.itemsize}",
                             self.path)
        self._placed[key] = True
        return True

    def _assembled(self, key: str) -> bytearray:
        """The whole tensor, built once in its own buffer from blocks of each chunk (one tensor cached)."""
        if self._whole is not None and self._whole[0] == key:
            return self._whole[1]
        self._whole = None  # the previous tensor goes before the next is built
        dt, shape, chunks = self._tensors[key]
        itemsize = dt.itemsize
        total = _prod(shape) * itemsize
        covered = sum(_prod(c.sizes) for c in chunks)
        if covered != _prod(shape):
            raise InputError(f"the chunks of tensor {key!r} cover {covered} of its {_prod(shape)} elements", self.path)
        stored = sum(c.length for c in chunks)
        if stored < total:  # checked before allocating: the sizes come from .metadata
            raise InputError(f"the chunks of tensor {key!r} hold {stored} bytes, fewer than its {total}", self.path)
        segs = [self.chunk_segment(key, dt, c) for c in chunks if _prod(c.sizes)]  # each checked against its file
        out = bytearray(total)
        for chunk, seg in zip([c for c in chunks if _prod(c.sizes)], segs, strict=True):
            place_chunk(out, seg, shape, chunk, itemsize)
        self._whole = (key, out)
        return out

    def close(self) -> None:
        self._whole = None
        for f in self._files.values():
            f.close()


def _prod(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def row_order(shape: tuple[int, ...], chunks: list[Chunk]) -> list[Chunk] | None:
    """The chunks in order when each is one contiguous run of the tensor and they follow each other; else None.

    A chunk is one run when it is a single index in every dimension before
    some dimension and spans every dimension after it: FSDP2's row blocks,
    and also the per-layer blocks of a stacked Megatron tensor
    (``[1, F, H]`` pieces of ``[L, 2F, H]``).
    """
    if not shape:
        return chunks if len(chunks) == 1 else None
    strides = contiguous_strides(shape)
    placed = []
    for c in chunks:
        if not _prod(c.sizes):
            continue
        k = next((d for d, n in enumerate(c.sizes) if n != 1), len(shape) - 1)
        if c.sizes[k + 1:] != shape[k + 1:]:
            return None
        placed.append((sum(o * st for o, st in zip(c.offsets, strides, strict=True)), c))
    placed.sort(key=lambda p: p[0])
    at = 0
    for start, c in placed:
        if start != at:
            return None
        at += _prod(c.sizes)
    return [c for _, c in placed] if at == _prod(shape) else None


def place_chunk(out: bytearray, seg: Segment, shape: tuple[int, ...], chunk: Chunk, itemsize: int) -> None:
    """Copy a chunk's C-ordered elements into the full tensor, reading at most _BLOCK bytes at a time."""
    sizes, offsets = chunk.sizes, chunk.offsets
    k = len(shape) - 1
    while k > 0 and sizes[k] == shape[k] and offsets[k] == 0:
        k -= 1  # trailing dimensions the chunk spans completely form one contiguous run
    run = _prod(sizes[k:]) * itemsize
    strides = contiguous_strides(shape)
    outer = sizes[:k]
    count = _prod(outer) if outer else 1
    per_block = max(1, _BLOCK // max(run, 1))
    index = [0] * k
    view = memoryview(out)
    done = 0
    while done < count:
        n = min(per_block, count - done)
        block = seg.source.read(seg.key, seg.offset + done * run, n * run)
        for j in range(n):
            start = (sum((offsets[d] + index[d]) * strides[d] for d in range(k)) + offsets[k] * strides[k]) * itemsize
            view[start:start + run] = block[j * run:(j + 1) * run]
            for d in range(k - 1, -1, -1):
                index[d] += 1
                if index[d] < outer[d]:
                    break
                index[d] = 0
        done += n
