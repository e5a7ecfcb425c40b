"""How writers hand bytes to the kernel: never more than CHUNK a write(), and copy_file_range only where the
source and the output share their offset within a page (writers/output.py says why: both were measured).

The bytes written are the same either way; these tests pin the choice of path
by recording the system calls the writer makes on real files.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from ckpt_tool.io.source import FileSource
from ckpt_tool.model import StorageRef
from ckpt_tool.writers import output
from ckpt_tool.writers.base import CHUNK
from ckpt_tool.writers.output import Output, copy_region, write_all
from ckpt_tool.writers.sourcebytes import Region

PAGE = mmap.PAGESIZE


def test_write_all_hands_the_kernel_at_most_a_chunk_a_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = os.urandom(3 * CHUNK + 123)
    sizes: list[int] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes | memoryview) -> int:
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    path = tmp_path / "out.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert write_all(fd, payload) == len(payload)
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert max(sizes) <= CHUNK and len(sizes) == 4
    assert path.read_bytes() == payload


def _copy(tmp_path: Path, name: str, src_offset: int, out_offset: int,
          monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes, list[int]]:
    """(bytes copied, bytes expected, copy_file_range lengths) for a 3 MiB region at ``src_offset`` appended
    at ``out_offset``."""
    data = os.urandom(src_offset + (3 << 20))
    src = tmp_path / f"{name}.src"
    src.write_bytes(data)
    source = FileSource(str(src), lambda key: (src_offset, len(data) - src_offset))
    calls: list[int] = []
    real = os.copy_file_range

    def recording(fd_in: int, fd_out: int, count: int, *args: int | None) -> int:
        calls.append(count)
        return real(fd_in, fd_out, count, *args)

    monkeypatch.setattr(os, "copy_file_range", recording)
    path = tmp_path / f"{name}.out"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.lseek(fd, out_offset, os.SEEK_SET)
        out = Output(fd)
        n = len(data) - src_offset
        copy_region(out, Region(StorageRef(source, "", n), 0, n))
    finally:
        os.close(fd)
        source.close()
        monkeypatch.undo()
    return path.read_bytes()[out_offset:], data[src_offset:], calls


@pytest.mark.skipif(not hasattr(os, "copy_file_range"), reason="no copy_file_range on this platform")
@pytest.mark.parametrize(("src_offset", "out_offset"), [(0, 0), (PAGE + 100, 100), (3 * PAGE, PAGE)])
def test_a_region_at_the_same_page_offset_is_copied_in_the_kernel(tmp_path, monkeypatch, src_offset, out_offset):
    got, want, calls = _copy(tmp_path, "aligned", src_offset, out_offset, monkeypatch)
    assert got == want
    assert sum(calls) >= len(want)


@pytest.mark.parametrize(("src_offset", "out_offset"), [(100, 0), (0, 8 + 1000), (PAGE + 4, PAGE)])
def test_a_region_at_another_page_offset_goes_through_one_buffer(tmp_path, monkeypatch, src_offset, out_offset):
    got, want, calls = _copy(tmp_path, "shifted", src_offset, out_offset, monkeypatch)
    assert got == want
    assert calls == []


def test_the_page_test_reads_the_outputs_position(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.lseek(fd, PAGE + 8, os.SEEK_SET)
        assert output._page_aligned(8, fd) and output._page_aligned(3 * PAGE + 8, fd)
        assert not output._page_aligned(0, fd)
    finally:
        os.close(fd)
