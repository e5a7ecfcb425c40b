"""Stale temporaries: a migrate killed with SIGKILL leaves its hidden output; the next run removes it.

Covers the owner record in temporary names, the liveness rule (host, pid and
start time, lock), ``ckpt doctor --clean``, and the whole story with real
processes: a migrate killed mid-write, then a second migrate into the same
folder, and a live writer (another process) whose temporary is never touched.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ckpt_tool.io.atomic import staletemp
from ckpt_tool.io.atomic.write import AtomicDir, AtomicFile
from tests.helpers.reliability import ROOT, run_main

DRIVER = str(ROOT / "tests" / "helpers" / "crash_driver.py")

HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
time.sleep(600)
"""


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not staletemp.process_alive(p.pid, 0)
    return p.pid


def make_temp(folder: Path, name: str = "out", *, pid: int | None = None, start: int = 0, host: str | None = None,
              ext: str = ".safetensors", size: int = 1000, is_dir: bool = False) -> Path:
    """A temporary as a writer with the given owner record would have left it."""
    host = host or staletemp.host_tag()
    pid = dead_pid() if pid is None else pid
    path = folder / f".{name}{staletemp.TEMP_MARK}{host}-{pid}-{start}-{os.urandom(4).hex()}{ext}"
    if is_dir:
        path.mkdir()
        (path / "model-00001-of-00001.safetensors").write_bytes(b"x" * size)
        (path / "model.safetensors.index.json").write_bytes(b"{}")
    else:
        path.write_bytes(b"x" * size)
    return path


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder`` (name -> sha256, mtime_ns), temporaries excluded."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and staletemp.TEMP_MARK not in str(p.relative_to(folder)):
            out[str(p.relative_to(folder))] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if staletemp.TEMP_MARK in p.name)


# ------------------------------------------------------------------ names and liveness


def test_temporary_names_record_host_pid_and_start_time(tmp_path):
    name = staletemp.owned_name(str(tmp_path / "model.safetensors"))
    base = os.path.basename(name)
    assert base.startswith(".model.ckpt-tmp-") and base.endswith(".safetensors")
    owner = staletemp.owner_of(name)
    assert owner is not None and owner.this_host
    assert owner.pid == os.getpid() and owner.start == staletemp.own_start()
    assert staletemp.owner_of(staletemp.owned_name(str(tmp_path / "shards"), ".d")) is not None
    assert staletemp.owned_name(str(tmp_path / "m.pth")) != staletemp.owned_name(str(tmp_path / "m.pth"))


def test_a_very_long_output_name_keeps_the_owner_record(tmp_path):
    name = staletemp.owned_name(str(tmp_path / ("é" * 120 + ".safetensors")))
    assert len(os.fsencode(os.path.basename(name))) <= 255
    assert staletemp.owner_of(name) is not None
    Path(name).write_bytes(b"")  # the file system accepts it


def test_names_without_an_owner_record_are_recognised_but_unowned():
    for legacy in (".out.ckpt-tmp-ba83d094.safetensors", ".report.xml.ckpt-tmp-4242", ".x.ckpt-tmp-1234abcd.d"):
        assert staletemp.is_temporary(legacy) and staletemp.owner_of(legacy) is None
    assert not staletemp.is_temporary("out.safetensors")
    assert not staletemp.is_temporary("notes.ckpt-tmp-.txt")  # not hidden: not ours


def test_process_liveness_uses_pid_start_time_and_zombie_state():
    assert staletemp.process_alive(os.getpid(), staletemp.own_start())
    assert staletemp.process_alive(os.getpid(), 0)
    assert not staletemp.process_alive(dead_pid(), 0)
    start = staletemp.own_start()
    if start:  # /proc is there: a recycled pid (same pid, another start time) is not the writer
        assert not staletemp.process_alive(os.getpid(), start + 1)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.3)  # killed, not reaped yet: a zombie writes nothing more
        if start:
            assert not staletemp.process_alive(p.pid, 0)
    finally:
        p.wait()


def test_atomic_outputs_hold_their_lock_until_done(tmp_path):
    for kind in (AtomicFile, AtomicDir):
        with kind(str(tmp_path / ("o.pth" if kind is AtomicFile else "o"))) as tmp:
            state, lock = staletemp._try_lock(tmp.path)
            assert state == "busy" and lock is None  # the writer holds it
            assert staletemp.clean(str(tmp_path)).found[0].verdict == "live"
        assert temporaries(tmp_path) == []


# ------------------------------------------------------------------ the rule, on files made by hand


def test_clean_removes_only_what_a_dead_writer_of_this_host_left(tmp_path):
    stale = make_temp(tmp_path, "a", size=1234)
    stale_dir = make_temp(tmp_path, "b", ext=".d", size=500, is_dir=True)
    live = make_temp(tmp_path, "c", pid=os.getpid(), start=staletemp.own_start())
    other_host = make_temp(tmp_path, "d", host="00000000" if staletemp.host_tag() != "00000000" else "11111111")
    legacy = tmp_path / ".e.ckpt-tmp-ba83d094.safetensors"
    legacy.write_bytes(b"old")
    (tmp_path / "model.safetensors").write_bytes(b"keep me")
    link = tmp_path / f".f{staletemp.TEMP_MARK}{staletemp.host_tag()}-{dead_pid()}-0-00000000.pth"
    link.symlink_to(tmp_path / "model.safetensors")
    before = snapshot(tmp_path)

    dry = staletemp.clean(str(tmp_path), dry_run=True)
    assert [Path(t.path).name for t in dry.stale] == sorted([stale.name, stale_dir.name])
    assert not dry.removed and stale.exists() and stale_dir.exists()

    report = staletemp.clean(str(tmp_path))
    verdicts = {Path(t.path).name: t.verdict for t in report.found}
    assert verdicts == {stale.name: "stale", stale_dir.name: "stale", live.name: "live",
                        other_host.name: "other-host", legacy.name: "unowned"}  # the symlink is not a candidate
    assert report.bytes_freed == 1234 + 502
    assert not stale.exists() and not stale_dir.exists()
    assert live.exists() and other_host.exists() and legacy.exists() and link.is_symlink()
    assert snapshot(tmp_path) == before


def test_a_locked_temporary_is_kept_even_when_its_pid_looks_dead(tmp_path):
    """Another pid namespace (a container) on this machine: its pid means nothing here, its lock does."""
    tmp = make_temp(tmp_path, "held")
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        report = staletemp.clean(str(tmp_path))
        assert [t.verdict for t in report.found] == ["in-use"] and tmp.exists()
    finally:
        holder.kill()
        holder.wait()
    assert staletemp.clean(str(tmp_path)).removed and not tmp.exists()  # its holder is gone: now it is stale


# ------------------------------------------------------------------ ckpt doctor --clean


def test_doctor_clean_is_recursive_and_reports_paths_and_bytes(tmp_path, run_cli):
    deep = tmp_path / "runs" / "exp1"
    deep.mkdir(parents=True)
    a = make_temp(tmp_path, "top", size=100)
    b = make_temp(deep, "deep", size=2048)
    live = make_temp(deep, "live", pid=os.getpid(), start=staletemp.own_start(), size=7)
    (deep / "model.pth").write_bytes(b"weights")
    before = snapshot(tmp_path)

    r = run_cli("doctor", "--clean", str(tmp_path), "--dry-run")
    assert r.code == 0, r
    assert "dry run: 2 stale temporary output(s) would be removed" in r.out and a.exists() and b.exists()

    r = run_cli("doctor", "--clean", str(tmp_path), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert sorted(t["path"] for t in doc["removed"]) == sorted([str(a), str(b)])
    assert doc["bytes_freed"] == 2148
    assert [t["path"] for t in doc["kept"]] == [str(live)] and doc["kept"][0]["verdict"] == "live"
    assert not a.exists() and not b.exists() and live.exists()
    assert snapshot(tmp_path) == before

    r = run_cli("doctor", "--clean", str(tmp_path))
    assert r.code == 0
    assert r.out.splitlines()[-1] == "removed 0 stale temporary output(s), 0 B freed; 1 kept"
    assert r.out.startswith("kept") and "its writer, pid" in r.out and "is still running" in r.out


def test_doctor_clean_errors(tmp_path, run_cli, monkeypatch):
    r = run_cli("doctor", "--clean", str(tmp_path / "nope"))
    assert r.code == 2 and "--clean needs a folder to search" in r.err and "does not exist" in r.err
    r = run_cli("doctor", "--dry-run")
    assert r.code == 2 and "--dry-run goes with --clean" in r.err
    make_temp(tmp_path, "x")

    def refuse(path: str, is_dir: bool) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(staletemp, "_remove", refuse)
    r = run_cli("doctor", "--clean", str(tmp_path))
    assert r.code == 1 and "FAILED" in r.out and "could not remove it: Permission denied" in r.out, r


# ------------------------------------------------------------------ real processes: killed, then rerun


@pytest.fixture(scope="module")
def big_source(tmp_path_factory) -> Path:
    """8 MiB in 1 MiB tensors: a kill mid-write leaves a temporary with real bytes on disk."""
    d = tmp_path_factory.mktemp("src")
    g = torch.Generator().manual_seed(0)
    p = d / "src.pth"
    torch.save({f"model.layer{i}.weight": torch.randn(512, 512, generator=g) for i in range(8)}, p)
    return p


def drive(point: str, sig: str, args: list[str], wait: bool = True):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, DRIVER, point, sig, os.devnull, "--", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


def assert_out_complete(out: Path, src: Path) -> None:
    from ckpt_tool.formats import load
    from ckpt_tool.tensors.data import tensor_bytes

    a, b = load(src), load(out)
    try:
        assert sorted(b.by_key) == sorted(a.by_key)
        for t in a.tensors:
            assert tensor_bytes(b.by_key[t.key]) == tensor_bytes(t), t.key
    finally:
        a.close()
        b.close()


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


@pytest.mark.parametrize("kind", ["pth", "safetensors", "sharded"])
def test_sigkilled_migrate_then_rerun_removes_and_reports_the_stale_temporary(tmp_path, big_source, kind):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "config.json").write_text('{"a": 1}')  # neighbours that must not be touched
    (out_dir / ".cache").mkdir()
    (out_dir / ".cache" / "x.bin").write_bytes(b"x" * 100)
    name, extra = {"pth": ("model.pth", []), "safetensors": ("model.safetensors", []),
                   "sharded": ("shards", ["--max-shard-size", "3MB"])}[kind]
    out = out_dir / name
    args = ["migrate", str(big_source), "-o", str(out), "--strip-prefix", "model.", "--device", "cpu", *extra]
    r = drive("writing:advance:6", "SIGKILL", args)
    assert r.returncode == -signal.SIGKILL, r.stderr
    stale = temporaries(out_dir)
    assert len(stale) == 1 and not out.exists()
    stale_bytes = _size(out_dir / stale[0])
    assert stale_bytes >= 4 << 20  # really mid-write, with bytes on disk
    src_hash = hashlib.sha256(big_source.read_bytes()).hexdigest()
    before = snapshot(out_dir)

    again = run_main([*args, "--json"])
    assert again.code == 0, again
    doc = json.loads(again.out)
    assert doc["cleaned"] == [{"path": str(out_dir / stale[0]), "bytes": stale_bytes}]
    assert doc["cleaned_bytes"] == stale_bytes
    assert again.err.strip() == (f"ckpt: removed a stale temporary output of a killed run "
                                 f"({stale_bytes / 2 ** 20:.1f} MiB freed): {out_dir / stale[0]}")
    assert temporaries(out_dir) == []
    assert doc["verified"] == {"cpu": True}
    from ckpt_tool.formats import load

    ck = load(out)
    try:
        assert sorted(ck.by_key) == [f"layer{i}.weight" for i in range(8)]
    finally:
        ck.close()
    after = snapshot(out_dir)
    assert {k: v for k, v in after.items() if not k.startswith(name)} == before  # nothing else was touched
    assert hashlib.sha256(big_source.read_bytes()).hexdigest() == src_hash


def test_a_live_writers_temporary_is_left_alone(tmp_path, big_source):
    """A migrate paused mid-write in another process; a second migrate and doctor --clean run beside it."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    go = tmp_path / "go"
    first = out_dir / "first.safetensors"
    a = drive("writing:advance:2", f"PAUSE:{go}", ["migrate", str(big_source), "-o", str(first), "--device", "cpu"],
              wait=False)
    try:
        deadline = time.monotonic() + 120
        while not Path(str(go) + ".paused").exists():
            assert a.poll() is None, a.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        live = temporaries(out_dir)
        assert len(live) == 1
        r = run_main(["migrate", str(big_source), "-o", str(out_dir / "second.pth"), "--device", "cpu", "--json"])
        assert r.code == 0, r
        assert json.loads(r.out)["cleaned"] == [] and r.err == ""
        r = run_main(["doctor", "--clean", str(out_dir), "--json"])
        assert r.code == 0
        doc = json.loads(r.out)
        assert doc["removed"] == [] and [Path(t["path"]).name for t in doc["kept"]] == live
        assert doc["kept"][0]["verdict"] == "live"
        assert temporaries(out_dir) == live
    finally:
        go.touch()
        _, err = a.communicate(timeout=120)
    assert a.returncode == 0, err  # the paused writer finished undisturbed
    assert_out_complete(first, big_source)
    assert temporaries(out_dir) == []
