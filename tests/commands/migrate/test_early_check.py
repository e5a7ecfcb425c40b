"""The early check: a safetensors output's tensors compared with their sources while the file is written.

What it proves is only what it compared, at the place the output's reader
puts it; a tensor that differs is never proven, and the final pass still
names it. Real files written by torch and safetensors; the size threshold
is lowered so that small files take the path.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tool.commands.migrate.verify import early
from ckpt_tool.commands.migrate.verify.compare import compare_pairs
from ckpt_tool.formats import ReadOptions, read_file
from ckpt_tool.writers.base import OutTensor
from ckpt_tool.writers.safetensors.single import write_safetensors

ROOT = Path(__file__).resolve().parents[3]


def _source(tmp_path: Path, name: str, seed: int) -> Path:
    g = torch.Generator().manual_seed(seed)
    # from 1 MiB a tensor is copied in the kernel on its own, so the writer reports each one as it lands
    tensors = {f"layers.{i}.weight": torch.randn(1024, 300 + i, generator=g) for i in range(12)}
    tensors["norm.weight"] = torch.randn(64, generator=g).to(torch.bfloat16)
    path = tmp_path / name
    save_file(tensors, str(path))
    return path


def _out_tensors(path: Path) -> tuple[list[OutTensor], list]:
    loaded = read_file(str(path), ReadOptions())
    return [OutTensor(k, m, m.dtype) for k, m in loaded.root.items()], loaded.sources


def _write(out: Path, tensors: list[OutTensor], check: early.EarlyCheck) -> early.Proven:
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        write_safetensors(fd, tensors, {}, None, check)
    finally:
        os.close(fd)
    return check.close(True)


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(early, "BATCH", 2 << 20)  # several batches in a file of 15 MB
    monkeypatch.setattr(early, "MIN_BYTES", 0)


def test_every_tensor_is_proven_where_the_reader_places_it(tmp_path, small_batches):
    tensors, sources = _out_tensors(_source(tmp_path, "a.safetensors", 0))
    out = tmp_path / "out.safetensors"
    proven = _write(out, tensors, early.EarlyCheck(str(out), tensors, ReadOptions().limits))
    assert sorted(proven) == sorted(t.key for t in tensors)
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    for key, (offset, length) in proven.items():
        begin, end = header[key]["data_offsets"]
        assert (offset, length) == (8 + n + begin, end - begin)
    assert {k: v.tolist() for k, v in load_file(str(out)).items()} == {
        k: v.tolist() for k, v in load_file(str(tmp_path / "a.safetensors")).items()}
    for s in sources:
        s.close()


def test_a_tensor_that_differs_is_never_proven_and_the_final_pass_names_it(tmp_path, small_batches):
    written, s1 = _out_tensors(_source(tmp_path, "a.safetensors", 0))
    other = _source(tmp_path, "b.safetensors", 0)
    b = load_file(str(other))
    b["layers.3.weight"][7, 5] += 1  # one value differs from what is written
    save_file(b, str(other))
    expected, s2 = _out_tensors(other)
    out = tmp_path / "out.safetensors"
    proven = _write(out, written, early.EarlyCheck(str(out), expected, ReadOptions().limits))
    assert "layers.3.weight" not in proven and len(proven) == len(written) - 1
    loaded = read_file(str(out), ReadOptions())
    pairs = [(t.key, t, loaded.root[t.key]) for t in expected]
    problems = compare_pairs(pairs, None, proven)
    assert len(problems) == 1 and problems[0].startswith("layers.3.weight: bytes differ")
    for s in (*s1, *s2, *loaded.sources):
        s.close()


def test_a_proven_span_elsewhere_in_the_file_is_compared_again(tmp_path):
    expected, s1 = _out_tensors(_source(tmp_path, "a.safetensors", 0))
    b = load_file(str(tmp_path / "a.safetensors"))
    b["norm.weight"] = b["norm.weight"] + 1
    save_file(b, str(tmp_path / "b.safetensors"))
    loaded = read_file(str(tmp_path / "b.safetensors"), ReadOptions())
    pairs = [(t.key, t, loaded.root[t.key]) for t in expected]
    wrong_place = {"norm.weight": (0, expected[-1].nbytes)}  # not where the reader puts it
    assert compare_pairs(pairs, None, wrong_place)[0].startswith("norm.weight: bytes differ")
    for s in (*s1, *loaded.sources):
        s.close()


def test_a_writer_that_stops_early_proves_nothing(tmp_path, small_batches):
    tensors, sources = _out_tensors(_source(tmp_path, "a.safetensors", 0))
    out = tmp_path / "out.safetensors"
    check = early.EarlyCheck(str(out), tensors, ReadOptions().limits)
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        check_reached = check.reached

        def stop_half_way(offset: int) -> None:
            check_reached(offset)
            if offset > 1 << 20:
                raise KeyboardInterrupt

        check.reached = stop_half_way  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            write_safetensors(fd, tensors, {}, None, check)
    finally:
        os.close(fd)
    assert check.close(False) == {}
    for s in sources:
        s.close()


def test_migrate_takes_the_path_and_verifies(tmp_path, small_batches, run_cli, monkeypatch):
    src = ROOT / "fixtures" / "deepspeed" / "zero3_bf16"
    out = tmp_path / "m.safetensors"
    seen: list[early.Proven] = []
    close = early.EarlyCheck.close
    monkeypatch.setattr(early.EarlyCheck, "close",
                        lambda self, finished: seen.append(close(self, finished)) or seen[-1])
    r = run_cli("migrate", str(src), "-o", str(out), "--json")
    assert len(seen) == 1 and seen[0], "the early check ran and proved tensors"
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert report["verified"] == {"cpu": True} and report["written"]
    plain = tmp_path / "plain.safetensors"
    early_off = run_cli("migrate", str(src), "-o", str(plain), "--no-verify", "--json")
    assert early_off.code == 0, early_off.err
    assert out.read_bytes() == plain.read_bytes()


def test_a_large_tensor_is_proven_part_by_part_and_only_whole(tmp_path, small_batches, monkeypatch):
    monkeypatch.setattr(early, "PART", 256 << 10)  # each 1.2 MB tensor in five parts
    written, s1 = _out_tensors(_source(tmp_path, "a.safetensors", 0))
    other = _source(tmp_path, "b.safetensors", 0)
    b = load_file(str(other))
    b["layers.5.weight"][-1, -1] += 1  # in its last part only
    save_file(b, str(other))
    expected, s2 = _out_tensors(other)
    out = tmp_path / "out.safetensors"
    check = early.EarlyCheck(str(out), expected, ReadOptions().limits)
    proven = _write(out, written, check)
    large = [t for t in expected if t.nbytes > early.PART]
    assert len(check._spans) > len(expected) + 3 * len(large)  # the large ones were compared in parts
    assert "layers.5.weight" not in proven and len(proven) == len(expected) - 1
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    for key, (offset, length) in proven.items():  # what is proven is the whole tensor, where it lies
        begin, end = header[key]["data_offsets"]
        assert (offset, length) == (8 + n + begin, end - begin)
    for s in (*s1, *s2):
        s.close()
