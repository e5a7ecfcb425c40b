"""The consolidated tensors' bytes, read from the rank files' storages, never a whole file in memory.

A tensor whose blocks are consecutive row blocks (FSDP2's ``Shard(0)``,
FSDP1's flat chunks, a replicated or plain tensor: one block) is its blocks
back to back: a SegmentSource reads any range of it straight from the rank
files (and writers copy those ranges in the kernel). Other splits (a
tensor-parallel ``Shard(1)``) are assembled once, in the tensor's own
buffer, 16 MiB of a block at a time (formats/dcp/stream.py's placement).
A block several ranks hold is compared, copy by copy, the first time its
tensor is read; a difference is an error (which rank, where).
"""
from __future__ import annotations

from ... import dtypes
from ...errors import InputError
from ...io import Segment, SegmentSource
from ...model import DataSource
from ..dcp import Chunk, StreamedOrAssembled, place_chunk, row_order
from .placement import Block
from .tiling import Tiled

_BLOCK = 16 << 20  # bytes compared at once between replicas


def segment(key: str, dt: dtypes.DType, b: Block, path: str) -> Segment:
    """The storage bytes holding block ``b``'s elements in C order."""
    local = b.local
    st = local.storage
    if st is None or st.source is None:
        raise InputError(f"the local tensor of {key!r} has no data", path)
    start, length = local.storage_offset * dt.itemsize, b.numel * dt.itemsize
    if start < 0 or start + length > st.nbytes:
        raise InputError(f"rank {b.rank}'s local tensor of {key!r} reaches past the end of its storage", path)
    return Segment(st.source, st.key, start, length)


class RanksSource(StreamedOrAssembled, DataSource):
    """Tensor bytes of a folder of rank files: each key a tiling of blocks of the ranks' storages."""

    def __init__(self, folder: str, inner: list[DataSource]) -> None:
        self.path = folder
        self._inner = inner
        self._tensors: dict[str, tuple[dtypes.DType, tuple[int, ...], Tiled]] = {}
        self._segments = SegmentSource(folder)
        self._placed: dict[str, bool] = {}  # key -> streamed (True) or assembled (False)
        self._checked: set[str] = set()
        self._whole: tuple[str, bytearray] | None = None

    def add(self, key: str, dt: dtypes.DType, shape: tuple[int, ...], tiled: Tiled) -> None:
        self._tensors[key] = (dt, shape, tiled)

    def _chunks(self, key: str) -> tuple[list[Chunk], dict[int, Block]]:
        _, _, tiled = self._tensors[key]
        chunks = [Chunk(b.offsets, b.sizes, "", 0, 0) for b in tiled.blocks]
        return chunks, {id(c): b for c, b in zip(chunks, tiled.blocks, strict=True)}

    def _plan(self, key: str) -> bool:
        """Register ``key``'s segments if its blocks are consecutive row blocks; True when streamed."""
        found = self._placed.get(key)
        if found is not None:
            return found
        dt, shape, _ = self._tensors[key]
        self._check_replicas(key)
        chunks, blocks = self._chunks(key)
        rows = row_order(shape, chunks)
        if rows is None:
            self._placed[key] = False
            return False
        self._segments.add(key, [segment(key, dt, blocks[id(c)], self.path) for c in rows])
        self._placed[key] = True
        return True

    def _check_replicas(self, key: str) -> None:
        """Every copy of a block another rank also holds must be byte for byte the same."""
        if key in self._checked:
            return
        dt, _, tiled = self._tensors[key]
        for copy, block in tiled.replicas:
            a, b = segment(key, dt, block, self.path), segment(key, dt, copy, self.path)
            for pos in range(0, a.length, _BLOCK):
                n = min(_BLOCK, a.length - pos)
                x = a.source.read(a.key, a.offset + pos, n)
                y = b.source.read(b.key, b.offset + pos, n)
                if x != y:
                    at = pos + next(i for i in range(n) if x[i] != y[i])
                    raise InputError(
                        f"tensor {key!r} is replicated, but rank {copy.rank}'s copy differs from rank "
                        f"{block.rank}'s (first at byte {at} of the block at offsets {list(block.offsets)}): "
                        "the ranks did not save the same values", self.path)
        self._checked.add(key)

    def _assembled(self, key: str) -> bytearray:
        """The whole tensor, built once in its own buffer from its blocks (one tensor cached)."""
        if self._whole is not None and self._whole[0] == key:
            return self._whole[1]
        self._whole = None  # the previous tensor goes before the next is built
        dt, shape, _ = self._tensors[key]
        total = dt.itemsize
        for d in shape:
            total *= d
        chunks, blocks = self._chunks(key)
        segs = [segment(key, dt, blocks[id(c)], self.path) for c in chunks]
        for seg in segs:  # each piece's last byte is in its file before the tensor is allocated (sizes come
            if seg.length:  # from the pickles, which a truncated or crafted file may overstate)
                seg.source.read(seg.key, seg.offset + seg.length - 1, 1)
        out = bytearray(total)
        for c, seg in zip(chunks, segs, strict=True):
            place_chunk(out, seg, shape, c, dt.itemsize)
        self._whole = (key, out)
        return out

    def close(self) -> None:
        self._whole = None
        for source in self._inner:
            source.close()
