"""Early write-back: the writers ask the kernel to start on what they wrote, every STEP bytes behind them.

The effect (a final fsync with little left to wait for) is a benchmark
figure (benchmarks/consolidate.py); here: the call exists and succeeds on
this file system, and every way a writer puts bytes into a file (gathered
writes, large writes, regions copied in the kernel) moves the write-back
along, without changing a byte.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ckpt_tool.io.atomic import writeback
from ckpt_tool.io.source import FileSource
from ckpt_tool.model import StorageRef
from ckpt_tool.writers.output import Output, copy_region
from ckpt_tool.writers.sourcebytes import Region

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


@linux
def test_sync_file_range_is_found_and_accepted_here(tmp_path: Path) -> None:
    func = writeback._sync_file_range()
    assert func is not None
    fd = os.open(tmp_path / "f.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * 65536)
        assert func(fd, 0, 65536, 2) == 0
    finally:
        os.close(fd)


def test_writeback_starts_every_step_from_the_writers_offset(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f.bin", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"y" * 4000, 1000)
        wb = writeback.Writeback(fd, start=1000, step=1024)
        wb.wrote(1000)
        assert (wb.done, wb.started) == (2000, 1000)  # less than a step: nothing asked yet
        wb.wrote(100)
        assert (wb.done, wb.started) == (2100, 2100)  # a step behind: asked for 1000..2100
        wb.wrote(2900)
        assert (wb.done, wb.started) == (5000, 5000)
    finally:
        os.close(fd)


def test_every_write_path_of_output_moves_the_writeback(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    payload = os.urandom(3 << 20)
    src.write_bytes(payload)
    out_path = tmp_path / "out.bin"
    fd = os.open(out_path, os.O_RDWR | os.O_CREAT, 0o600)
    source = FileSource(str(src), lambda key: (0, len(payload)))
    try:
        os.lseek(fd, 16, os.SEEK_SET)  # a parallel writer's unit starts inside the file
        out = Output(fd, flush_at=1 << 20)
        assert out.writeback is not None
        out.writeback.step = 1 << 20
        assert out.writeback.done == 16
        out.write(b"a" * 1000)  # gathered, not yet in the file
        assert out.writeback.done == 16
        out.write(bytearray(b"b" * 2000))  # a reused buffer: the gathered bytes and it go at once
        assert out.writeback.done == 16 + 3000
        copy_region(out, Region(StorageRef(source, "", len(payload)), 0, len(payload)))  # a region copied
        out.flush()
        assert out.writeback.done == 16 + 3000 + len(payload)
        assert out.writeback.started > 16  # the write-back was asked for behind the writer
    finally:
        os.close(fd)
        source.close()
    assert out_path.read_bytes() == b"\0" * 16 + b"a" * 1000 + b"b" * 2000 + payload
