"""One output written by several processes: each writes its share at places fixed before any byte is written.

A safetensors file's layout is known from its header alone (every tensor's
byte range), and a sharded set's from its shard plan, so the output is cut
into *units*, each a run of tensors at a known offset of a known file:

- one ``.safetensors`` file: contiguous groups of tensors, balanced by bytes,
  written at their offsets after the header (the header is written first,
  by whoever owns the file);
- a sharded set: whole shard files (the index is written last, by one process).

Shares are lists of units, the same for every process that computes them
from the same tensors; each process writes its share with its own file
descriptors and fsyncs what it wrote (on a shared file system each writer
must flush its own writes).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .base import OutTensor
from .output import Output
from .safetensors import Shard, header_bytes, plan_shards, write_body, write_shard


class Unit(NamedTuple):
    """Tensors written back to back into ``name`` (a file of the output) from byte ``offset``."""

    name: str  # "" for a single-file output, else the shard file name
    offset: int
    tensors: list[OutTensor]
    shard: Shard | None = None  # a whole shard file (written with its own header)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def safetensors_units(stored: Sequence[OutTensor], metadata: Mapping[str, str], count: int) -> tuple[bytes, list[Unit]]:
    """(header, units) of one safetensors file cut into at most ``count`` runs of about equal bytes."""
    header = header_bytes(stored, metadata)
    total = sum(t.nbytes for t in stored)
    units: list[Unit] = []
    target = total / max(1, count)
    pos = len(header)
    current: list[OutTensor] = []
    start = pos
    done = 0
    for t in stored:
        current.append(t)
        done += t.nbytes
        if done >= target * (len(units) + 1) and len(units) < count - 1:
            units.append(Unit("", start, current))
            start, current = len(header) + done, []
    if current or not units:
        units.append(Unit("", start, current))
    return header, units


def shard_units(stored: Sequence[OutTensor], aliases: Mapping[str, str], metadata: Mapping[str, str],
                max_bytes: int) -> list[Unit]:
    return [Unit(s.name, 0, s.tensors, s) for s in plan_shards(stored, aliases, metadata, max_bytes)]


def assign(units: Sequence[Unit], count: int) -> list[list[int]]:
    """Unit indices per share: the largest units first, each to the least-loaded share (deterministic)."""
    shares: list[list[int]] = [[] for _ in range(max(1, count))]
    loads = [0] * len(shares)
    for i in sorted(range(len(units)), key=lambda i: (-units[i].nbytes, i)):
        k = min(range(len(shares)), key=lambda s: (loads[s], s))
        shares[k].append(i)
        loads[k] += units[i].nbytes
    return [sorted(s) for s in shares]


def write_unit(folder_or_file: str, unit: Unit, on_bytes: Callable[[int], None] | None = None,
               sync: bool = True) -> int:
    """Write one unit; returns its bytes. Single-file units go into the existing file.

    ``sync`` fsyncs what was written (each writer on a shared file system);
    on one machine the owner's fsync of the file flushes every writer's pages.
    """
    if unit.shard is not None:
        path = os.path.join(folder_or_file, unit.name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            n = write_shard(fd, unit.shard, on_bytes)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return n
    fd = os.open(folder_or_file, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.lseek(fd, unit.offset, os.SEEK_SET)
        n = write_tensors(fd, unit.tensors, on_bytes)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return n


def write_tensors(fd: int, tensors: Sequence[OutTensor], on_bytes: Callable[[int], None] | None = None) -> int:
    """The tensors' bytes back to back from ``fd``'s position (as write_safetensors writes its body)."""
    return write_body(Output(fd), tensors, on_bytes)
