"""migrate refuses an output that would not fit, before it reads a tensor byte.

The planned size of every output format is checked against what the
writers really write; the refusal is checked on a real small tmpfs where the
test may mount one, and everywhere with the free-space figure patched at the
library boundary (``os.statvfs``), together with tripwires on every path
that reads tensor bytes or creates the output.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ckpt_tool.io.atomic import freespace, staletemp
from ckpt_tool.writers import sizes
from tests.helpers.errors import assert_one_line_error
from tests.helpers.reliability import run_ckpt, run_main

OUTPUTS = {  # kind -> (OUT name, extra migrate options)
    "pth": ("out.pth", []),
    "safetensors": ("out.safetensors", []),
    "sharded": ("shards", ["--max-shard-size", "300KB"]),
    "dcp": ("dcp", ["--to", "dcp"]),
    "hf": ("hf", ["--to", "hf"]),
    "hf-sharded": ("hf_shards", ["--to", "hf", "--max-shard-size", "300KB"]),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """About 1 MiB, with a tie, a unicode key, a 0-dim tensor and metadata."""
    d = tmp_path_factory.mktemp("src")
    g = torch.Generator().manual_seed(0)
    sd = {f"block.{i}.weight": torch.randn(128, 128, generator=g) for i in range(16)}
    sd["block.0.tied"] = sd["block.0.weight"]
    sd["émbed.wéight"] = torch.randn(7, 3, generator=g).to(torch.bfloat16)
    sd["scale"] = torch.tensor(2.5)
    p = d / "src.pth"
    torch.save({"state_dict": sd, "epoch": 3, "note": "hello"}, p)
    return p


@pytest.fixture
def plans(monkeypatch) -> dict[str, list]:
    """Records the quick bound and the exact plan of each migrate (the bound is then ignored, so the
    exact sizes are always computed)."""
    seen: dict[str, list] = {"bound": [], "exact": []}
    bound, exact = sizes.quick_bound, sizes.planned_sizes

    def record_bound(*a, **k):
        seen["bound"].append(bound(*a, **k))

    def record_exact(*a, **k):
        seen["exact"].append(exact(*a, **k))
        return seen["exact"][-1]

    monkeypatch.setattr(sizes, "quick_bound", record_bound)
    monkeypatch.setattr(sizes, "planned_sizes", record_exact)
    return seen


def _files(out: Path) -> list[int]:
    if out.is_dir():
        return sorted(p.stat().st_size for p in out.iterdir())
    return [out.stat().st_size]


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
@pytest.mark.parametrize("dtype", [None, "fp16"])
def test_planned_sizes_match_what_is_written(tmp_path, source, plans, kind, dtype):
    name, extra = OUTPUTS[kind]
    out = tmp_path / name
    r = run_main(["migrate", str(source), "-o", str(out), "--device", "cpu", *extra,
                  *(["--dtype", dtype] if dtype else [])])
    assert r.code == 0, r
    planned, written = sorted(plans["exact"][0]), _files(out)
    assert len(planned) == len(written)
    if kind == "pth":
        assert planned == written  # replayed exactly
    else:
        for p, w in zip(planned, written, strict=True):
            assert w <= p <= w + 64 * 1024 + 2048 * 20, (planned, written)  # an upper bound, and a close one
    total, files = plans["bound"][0]
    assert total >= sum(planned) and files >= len(planned)  # the quick bound never says less than the plan


def test_planned_zip_size_is_exact_with_zip64_records(tmp_path, source, monkeypatch, plans):
    from ckpt_tool.writers.torchsave import archive as torchzip

    monkeypatch.setattr(torchzip, "ZIP64_LIMIT", 4096)  # every member and offset past it
    out = tmp_path / "out.pth"
    r = run_main(["migrate", str(source), "-o", str(out), "--device", "cpu", "--no-verify"])
    assert r.code == 0, r
    assert plans["exact"] == [[out.stat().st_size]]
    assert plans["bound"][0][0] >= out.stat().st_size


# ------------------------------------------------------------------ refusing, before any read


def fake_statvfs(free: int, block: int = 4096):
    def statvfs(path):
        return os.statvfs_result((block, block, 1 << 30, free // block, free // block, 1000, 1000, 1000, 0, 255))
    return statvfs


@pytest.fixture
def tripwires(monkeypatch):
    """Fail loudly if anything reads a tensor byte, starts a writer or creates the output."""
    from ckpt_tool.io.atomic import write as atomic
    from ckpt_tool.tensors.data import tensordata
    from ckpt_tool.writers import dcp, output, sourcebytes
    from ckpt_tool.writers.safetensors import sharded, single as safetensors
    from ckpt_tool.writers.torchsave import archive as torchzip

    def tripped(*a, **k):
        raise AssertionError("tensor bytes were read or the output was created")

    for module, name in [(tensordata, "tensor_bytes"), (sourcebytes, "stream_region"), (sourcebytes, "out_chunks"),
                         (sourcebytes, "tensor_data"), (sourcebytes, "storage_data"), (output, "copy_region"),
                         (torchzip, "write_torch_zip"), (safetensors, "write_safetensors"),
                         (sharded, "write_sharded"), (dcp, "write_dcp"),
                         (atomic.AtomicFile, "__enter__"), (atomic.AtomicDir, "__enter__")]:
        monkeypatch.setattr(module, name, tripped)


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_too_little_free_space_is_refused_before_any_read(tmp_path, source, monkeypatch, tripwires, kind):
    monkeypatch.setattr(os, "statvfs", fake_statvfs(512 * 1024))
    name, extra = OUTPUTS[kind]
    out = tmp_path / "out" / name
    out.parent.mkdir()
    r = run_main(["migrate", str(source), "-o", str(out), "--device", "cpu", *extra])
    assert_one_line_error(r, f"ckpt: error: {out}: not enough free space: writing it needs ",
                          f"but {out.parent} has 512.0 KiB (524288 bytes) free; free some space or write to "
                          "another file system (nothing was read or written)")
    assert os.listdir(out.parent) == []


def test_the_boundary_and_force(tmp_path, source, monkeypatch, plans):
    out = tmp_path / "out.safetensors"
    assert run_main(["migrate", str(source), "-o", str(out), "--device", "cpu"]).code == 0
    before = out.read_bytes()
    args = ["migrate", str(source), "-o", str(out), "--device", "cpu", "--force", "--drop", "scale"]
    monkeypatch.setattr(os, "statvfs", fake_statvfs(0))
    assert run_main(args).code == 2
    planned = plans["exact"][-1]
    need = freespace.needed(planned, 4096)  # what this plan needs: its files in whole blocks, plus the margin
    assert need == -(-planned[0] // 4096) * 4096 + (1 << 20)
    monkeypatch.setattr(os, "statvfs", fake_statvfs(need - 4096))
    r = run_main(args)
    assert_one_line_error(r, "not enough free space", f"needs 2.0 MiB ({need} bytes, a 1.0 MiB margin included)")
    assert out.read_bytes() == before  # --force does not skip the check, and the old OUT is untouched
    monkeypatch.setattr(os, "statvfs", fake_statvfs(need))
    r = run_main(args)
    assert r.code == 0, r
    assert out.read_bytes() != before


def test_the_exact_sizes_are_computed_only_when_the_quick_bound_does_not_fit(tmp_path, source, monkeypatch):
    calls = []
    real = sizes.planned_sizes
    monkeypatch.setattr(sizes, "planned_sizes", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert run_main(["migrate", str(source), "-o", str(tmp_path / "a.safetensors"), "--device", "cpu"]).code == 0
    assert calls == []  # plenty of room: the sums alone said so
    monkeypatch.setattr(os, "statvfs", fake_statvfs(1024 * 1024))
    assert run_main(["migrate", str(source), "-o", str(tmp_path / "b.safetensors"), "--device", "cpu"]).code == 2
    assert calls == [1]


@pytest.mark.parametrize("how", ["raises", "no-blocks"])
def test_a_file_system_that_does_not_say_is_not_refused(tmp_path, source, monkeypatch, how):
    def statvfs(path):
        if how == "raises":
            raise OSError(38, "Function not implemented")
        return os.statvfs_result((4096, 4096, 0, 0, 0, 0, 0, 0, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)
    r = run_main(["migrate", str(source), "-o", str(tmp_path / "o.safetensors"), "--device", "cpu"])
    assert r.code == 0, r


# ------------------------------------------------------------------ a real small file system


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_a_real_small_tmpfs_is_refused_with_one_line(tmp_path, source, kind):
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN); the patched statvfs tests cover it")
    try:
        name, extra = OUTPUTS[kind]
        out = disk / name
        r = run_ckpt(["migrate", str(source), "-o", str(out), "--device", "cpu", *extra])
        assert_one_line_error(r, f"{out}: not enough free space", "has 1.0 MiB (1048576 bytes) free",
                              "(nothing was read or written)")
        assert os.listdir(disk) == []
    finally:
        _umount(disk)


def test_stale_temporaries_are_removed_before_the_space_is_counted(tmp_path, source):
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "4m"):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        p = subprocess.Popen(["true"])
        p.wait()
        stale = disk / f".out{staletemp.TEMP_MARK}{staletemp.host_tag()}-{p.pid}-0-0badf00d.safetensors"
        stale.write_bytes(b"\0" * (3 << 20))  # a killed run's 3 MiB: without it the output would not fit
        out = disk / "out.safetensors"
        r = run_ckpt(["migrate", str(source), "-o", str(out), "--device", "cpu", "--json"])
        assert r.code == 0, r
        assert json.loads(r.out)["cleaned"] == [{"path": str(stale), "bytes": 3 << 20}]
        assert r.err.strip() == f"ckpt: removed a stale temporary output of a killed run (3.0 MiB freed): {stale}"
        assert os.listdir(disk) == ["out.safetensors"]
    finally:
        _umount(disk)
