"""Tensors that are byte ranges of other storages, back to back: what consolidation reads.

A DeepSpeed parameter is a slice of the concatenated fp32 partitions of
every rank (ZeRO-1/2) or one piece from each rank (ZeRO-3); a row-sharded DCP
tensor is its chunks one after the other. Each becomes a list of Segments
(storage, byte offset, length) and ``SegmentSource`` reads any byte range of
the whole by reading only the segments it overlaps, straight from their
files: no partition, chunk or tensor is ever assembled in memory, and every
input byte a writer asks for is read once.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import NamedTuple

from ..errors import InputError
from ..model import DataSource
from .source import FileSource


class Segment(NamedTuple):
    """``length`` bytes at ``offset`` of storage ``key`` of ``source``."""

    source: DataSource
    key: str
    offset: int
    length: int


class Part(NamedTuple):
    """A 1-D run of elements inside a storage (one rank's partition, one fragment)."""

    source: DataSource
    key: str
    offset: int  # bytes into the storage
    numel: int


def concat_slice(parts: Sequence[Part], start: int, count: int, itemsize: int,
                 starts: Sequence[int] | None = None) -> list[Segment]:
    """Elements [start, start + count) of the concatenation of ``parts``, as segments.

    ``starts`` (the running element count before each part) may be passed
    when the same parts are sliced many times.
    """
    if count <= 0:
        return []
    if starts is None:
        starts = [0, *accumulate(p.numel for p in parts)]
    total = starts[-1]
    if start < 0 or start + count > total:
        raise ValueError(f"elements {start}..{start + count} lie past the {total} the partitions hold")
    out: list[Segment] = []
    i = bisect_right(starts, start) - 1
    pos, left = start, count
    while left:
        while parts[i].numel == 0 or pos >= starts[i + 1]:
            i += 1
        part = parts[i]
        local = pos - starts[i]
        take = min(left, part.numel - local)
        seg = Segment(part.source, part.key, part.offset + local * itemsize, take * itemsize)
        if out and out[-1].source is seg.source and out[-1].key == seg.key \
                and out[-1].offset + out[-1].length == seg.offset:
            prev = out.pop()
            seg = Segment(prev.source, prev.key, prev.offset, prev.length + seg.length)
        out.append(seg)
        pos += take
        left -= take
    return out


class SegmentSource(DataSource):
    """Storages made of segments of other storages, read segment by segment.

    Reading never joins more than the caller asked for: ``read_into`` fills
    the caller's buffer from each segment in place (one ``preadv`` per
    segment for files).
    """

    def __init__(self, path: str, inner: Sequence[DataSource] = ()) -> None:
        self.path = path
        self._segments: dict[str, tuple[Segment, ...]] = {}
        self._starts: dict[str, list[int]] = {}
        self._inner = list(inner)

    def add(self, key: str, segments: Sequence[Segment]) -> int:
        """Register storage ``key``; returns its length in bytes."""
        self._segments[key] = tuple(segments)
        starts = [0, *accumulate(s.length for s in segments)]
        self._starts[key] = starts
        return starts[-1]

    def segments(self, key: str) -> tuple[Segment, ...]:
        return self._segments[key]

    def pieces(self, key: str, offset: int, length: int) -> Iterator[Segment]:
        """The segments (cut to size) that hold bytes [offset, offset + length) of ``key``."""
        segs, starts = self._segments[key], self._starts[key]
        if offset < 0 or length < 0 or offset + length > starts[-1]:
            raise InputError(f"storage {key!r} holds {starts[-1]} bytes, not {offset + length}", self.path)
        if not length:
            return
        i = bisect_right(starts, offset) - 1
        pos, end = offset, offset + length
        while pos < end:
            seg = segs[i]
            local = pos - starts[i]
            take = min(end - pos, seg.length - local)
            if take > 0:
                yield Segment(seg.source, seg.key, seg.offset + local, take)
                pos += take
            i += 1

    def file_pieces(self, key: str, offset: int, length: int) -> list[Segment] | None:
        """The pieces when every one is a region of a plain file (writers copy those in the kernel), else None."""
        found = list(self.pieces(key, offset, length))
        return found if all(type(s.source) is FileSource for s in found) else None

    def read(self, key: str, offset: int, length: int) -> bytes:
        parts = [s.source.read(s.key, s.offset, s.length) for s in self.pieces(key, offset, length)]
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        pos = 0
        for s in self.pieces(key, offset, len(out)):
            s.source.read_into(s.key, s.offset, out[pos:pos + s.length])
            pos += s.length

    def close(self) -> None:
        for source in self._inner:
            source.close()
