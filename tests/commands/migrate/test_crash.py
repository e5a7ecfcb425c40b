"""Crash consistency of ``ckpt migrate``: kills, Ctrl-C, full disks, read-only folders, races.

The harness (tests/helpers/crash_driver.py) runs the real CLI in a subprocess and
signals it at named points of its progress: every stage of writing and of
verification, for each output kind. After every kill:

- SRC is byte-identical (sha256);
- OUT is absent, or a complete checkpoint that verifies (every tensor equal
  to SRC's, bit for bit); with --force over an old OUT, OUT is the old file
  untouched or the new one complete;
- after SIGINT/SIGTERM: exit 130, one line, no temporary file left behind
  (after SIGKILL nothing can clean up: a hidden ``.NAME.ckpt-tmp-*`` file may
  stay, and must not confuse anything; the next migrate into the folder
  removes it, see test_staletemp.py);
- a rerun succeeds.

Then: a full disk (RLIMIT_FSIZE, and a real full tmpfs where one can be
mounted; the free-space check that normally refuses first is in
test_freespace.py), a read-only destination (a read-only bind mount), OUT equal to SRC
(directly, through a symlink, through a hard link) and two migrations racing
to the same OUT.
"""
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.errors import assert_one_line_error
from tests.helpers.reliability import ROOT, problems, run_ckpt, run_main

DRIVER = str(ROOT / "tests" / "helpers" / "crash_driver.py")
TMP_MARK = ".ckpt-tmp-"

OUTPUTS = {  # kind -> (OUT name, extra migrate options)
    "pth": ("out.pth", []),
    "safetensors": ("out.safetensors", []),
    "sharded": ("shards", ["--max-shard-size", "40KB"]),
}


def sha256(path: Path) -> str:
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(path.rglob("*")):
            if p.is_file():
                h.update(p.name.encode() + b"\0" + p.read_bytes())
        return h.hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A checkpoint with enough tensors for many progress points (about 200 KB)."""
    d = tmp_path_factory.mktemp("src")
    g = torch.Generator().manual_seed(0)
    sd = {f"block.{i}.weight": torch.randn(64, 64, generator=g) for i in range(10)}
    sd["block.0.tied"] = sd["block.0.weight"]  # a tie, so writers take their alias paths too
    sd["scale"] = torch.tensor(2.5)
    p = d / "src.pth"
    torch.save(sd, p)
    return p


def drive(point: str, sig: str, args: list[str], events: Path | None = None, timeout: float = 120,
          wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, DRIVER, point, sig, str(events or os.devnull), "--", *args]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def record_events(tmp_path: Path, args: list[str]) -> list[str]:
    events = tmp_path / "events.txt"
    r = drive("record", "SIGKILL", args, events)
    assert r.returncode == 0, r.stderr
    names = events.read_text().split()
    events.unlink()
    return names


def kill_points(events: list[str]) -> list[str]:
    """Every stage's start and end and first, middle and last step: the whole run, evenly."""
    points: list[str] = []
    by_stage: dict[str, list[str]] = {}
    for e in events:
        by_stage.setdefault(e.split(":")[0], []).append(e)
    for stage_events in by_stage.values():
        steps = [e for e in stage_events if ":advance:" in e]
        picks = [stage_events[0], *(steps[:1] + steps[len(steps) // 2:len(steps) // 2 + 1] + steps[-1:]),
                 stage_events[-1]]
        points += [p for p in dict.fromkeys(picks)]
    return points


def assert_out_complete(out: Path, src: Path) -> None:
    """OUT is a whole checkpoint holding exactly SRC's tensors, bit for bit."""
    from ckpt_tool.formats import load
    from ckpt_tool.tensors.data import tensor_bytes

    a, b = load(src), load(out)
    try:
        got = b.by_key
        assert sorted(got) == sorted(a.by_key)
        for t in a.tensors:
            assert tensor_bytes(got[t.key]) == tensor_bytes(t), t.key
    finally:
        a.close()
        b.close()


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TMP_MARK in p.name)


def clean(folder: Path, out: Path) -> None:
    for p in [out, *[folder / n for n in temporaries(folder)]]:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


# ---------------------------------------------------------------- killing migrate


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OUTPUTS))
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_killed_at_every_stage_leaves_src_intact_and_out_absent_or_complete(tmp_path, source, kind, sig):
    name, extra = OUTPUTS[kind]
    src_hash = sha256(source)
    out = tmp_path / name
    args = ["migrate", str(source), "-o", str(out), "--device", "cpu", *extra]
    points = kill_points(record_events(tmp_path, args))
    assert any(p.startswith("writing:") for p in points) and any(p.startswith("verifying:") for p in points)
    clean(tmp_path, out)
    for point in points:
        r = drive(point, sig, args)
        assert sha256(source) == src_hash, point
        if sig == "SIGKILL":
            assert r.returncode == -signal.SIGKILL, (point, r.returncode, r.stderr)
        else:
            assert r.returncode == 130, (point, r.returncode, r.stderr)
            assert r.stderr.strip() == "ckpt: interrupted", (point, r.stderr)
            assert not temporaries(tmp_path), (point, temporaries(tmp_path))
        if out.exists():
            assert_out_complete(out, source)
        rerun = run_main(args if not out.exists() else [*args, "--force"])
        assert rerun.code == 0 and not problems(rerun), (point, rerun)
        assert_out_complete(out, source)
        assert sha256(source) == src_hash
        clean(tmp_path, out)


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_killed_force_run_keeps_the_old_output_or_the_whole_new_one(tmp_path, source, sig):
    out = tmp_path / "out.safetensors"
    assert run_main(["migrate", str(source), "-o", str(out), "--drop", "block.9.*", "--device", "cpu"]).code == 0
    old_hash = sha256(out)
    args = ["migrate", str(source), "-o", str(out), "--force", "--device", "cpu"]
    points = kill_points(record_events(tmp_path, args))
    assert run_main(["migrate", str(source), "-o", str(out), "--drop", "block.9.*", "--force"]).code == 0
    for point in points:
        old_hash = sha256(out)
        r = drive(point, sig, args)
        assert r.returncode in (-signal.SIGKILL, 130), (point, r.returncode, r.stderr)
        now = sha256(out)
        if now != old_hash:
            assert_out_complete(out, source)  # replaced only by a complete, verified output
        if sig != "SIGKILL":
            assert not temporaries(tmp_path), point
        # back to the old output for the next point
        assert run_main(["migrate", str(source), "-o", str(out), "--drop", "block.9.*", "--force"]).code == 0


def test_stale_temporaries_from_a_killed_run_do_not_confuse_a_rerun(tmp_path, source):
    out = tmp_path / "out.pth"
    args = ["migrate", str(source), "-o", str(out), "--device", "cpu"]
    r = drive("writing:advance:2", "SIGKILL", args)
    assert r.returncode == -signal.SIGKILL
    stale = temporaries(tmp_path)
    assert stale and not out.exists()  # SIGKILL: nothing could clean up, and OUT never appeared
    r = run_main(["inspect", str(tmp_path / stale[0])])  # a stale temporary is a cut file, reported as such
    assert r.code == 2 and not problems(r), r
    rerun = run_main(args)
    assert rerun.code == 0 and not problems(rerun), rerun
    assert_out_complete(out, source)
    assert temporaries(tmp_path) == []  # the rerun removed the dead writer's temporary, and said so
    assert rerun.err.startswith("ckpt: removed a stale temporary output of a killed run")


@pytest.mark.slow
def test_ctrl_c_at_random_moments_of_a_larger_migration(tmp_path):
    """Timed interrupts (no hook) over a checkpoint that takes a moment to migrate."""
    src = tmp_path / "big.pth"
    g = torch.Generator().manual_seed(1)
    torch.save({f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(12)}, src)  # 48 MB
    src_hash = sha256(src)
    out = tmp_path / "big.safetensors"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (0.0, 0.1, 0.3, 0.6):
        p = subprocess.Popen([sys.executable, "-m", "ckpt_tool", "migrate", str(src), "-o", str(out), "--device",
                              "cpu", "--force"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # from the moment the temporary output exists (Ctrl-C during interpreter start-up is Python's, not ckpt's)
        deadline = time.monotonic() + 60
        while not temporaries(tmp_path) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        # 130: interrupted and cleaned up; 0: it landed after the work was done (then ckpt ignores it,
        # so the interpreter's shutdown prints no "Exception ignored ... KeyboardInterrupt" traceback)
        assert p.returncode in (0, 130), (delay, p.returncode, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
        assert sha256(src) == src_hash
        assert not temporaries(tmp_path), (delay, temporaries(tmp_path))
        if out.exists():
            assert_out_complete(out, src)


# ----------------------------------------------------------------- disk trouble


def _fsize_limit(nbytes: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return apply


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_file_size_limit_mid_write_is_one_error_and_no_output(tmp_path, source, kind):
    name, extra = OUTPUTS[kind]
    if kind == "sharded":
        extra = ["--max-shard-size", "150KB"]  # one shard larger than the limit
    out = tmp_path / name
    r = run_ckpt(["migrate", str(source), "-o", str(out), "--device", "cpu", *extra],
                 preexec_fn=_fsize_limit(60_000))
    assert_one_line_error(r, "nothing was left behind")
    assert not out.exists() and not temporaries(tmp_path)


def _mount(args: list[str]) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, check=False)


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_disk_full_is_one_error_and_no_output(tmp_path, source, kind, monkeypatch):
    """The disk fills up mid-write (another process took the space after the free-space check)."""
    from ckpt_tool.io.atomic import freespace

    disk = tmp_path / "small"
    disk.mkdir()
    if not _mount(["-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)]):
        pytest.skip("cannot mount a small tmpfs here (needs root with CAP_SYS_ADMIN); RLIMIT_FSIZE covers the path")
    try:
        name, extra = OUTPUTS[kind]
        out = disk / name
        monkeypatch.setattr(freespace, "available", lambda folder: None)  # the check sees no figure: writing starts
        r = run_main(["migrate", str(source), "-o", str(out), "--device", "cpu", *extra])
        assert_one_line_error(r, "no space left on the device", "nothing was left behind")
        assert not out.exists() and not temporaries(disk) and os.listdir(disk) == []
    finally:
        _umount(disk)


def test_read_only_destination(tmp_path, source):
    real = tmp_path / "real"
    real.mkdir()
    ro = tmp_path / "ro"
    ro.mkdir()
    if not _mount(["--bind", "-o", "ro", str(real), str(ro)]):
        pytest.skip("cannot make a read-only bind mount here; as root, permission bits do not stop writes")
    try:
        probe = ro / "probe"
        try:
            probe.touch()
            probe.unlink()
            pytest.skip("the bind mount is not read-only on this kernel")
        except OSError:
            pass
        out = ro / "out.safetensors"
        r = run_main(["migrate", str(source), "-o", str(out), "--device", "cpu"])
        assert_one_line_error(r, "read-only")
        assert os.listdir(real) == []
    finally:
        _umount(ro)


# ------------------------------------------------------------ OUT is SRC, races


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "symlinked-folder"])
@pytest.mark.parametrize("force", [False, True])
def test_out_equal_to_src_is_refused_and_src_untouched(tmp_path, source, how, force):
    src = tmp_path / "src.pth"
    src.write_bytes(source.read_bytes())
    src_hash = sha256(src)
    if how == "same":
        out = src
    elif how == "symlink":
        out = tmp_path / "link.pth"
        out.symlink_to(src)
    elif how == "hardlink":
        out = tmp_path / "hard.pth"
        os.link(src, out)
    else:
        alias = tmp_path / "alias"
        alias.symlink_to(tmp_path, target_is_directory=True)
        out = alias / "src.pth"
    r = run_main(["migrate", str(src), "-o", str(out), "--device", "cpu"] + (["--force"] if force else []))
    assert r.code == 2 and not problems(r), r
    assert sha256(src) == src_hash
    assert not temporaries(tmp_path)


@pytest.mark.parametrize("force", [False, True])
def test_two_migrations_racing_to_the_same_out(tmp_path, source, force):
    """A pauses after writing (before verifying and publishing); B runs whole; then A goes on."""
    out = tmp_path / "out.safetensors"
    go = tmp_path / "go"
    opts = ["--force"] if force else []
    a = drive("verifying:start", f"PAUSE:{go}", ["migrate", str(source), "-o", str(out), "--device", "cpu", *opts],
              wait=False)
    deadline = time.monotonic() + 120
    while not Path(str(go) + ".paused").exists():
        assert a.poll() is None, a.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    b = run_ckpt(["migrate", str(source), "-o", str(out), "--device", "cpu", *opts])
    assert b.code == 0, b
    b_hash = sha256(out)
    go.touch()
    _, err = a.communicate(timeout=120)
    if force:
        assert a.returncode == 0, err  # --force: the later run replaces OUT, whole
    else:
        assert a.returncode == 2 and "--force" in err and len(err.strip().splitlines()) == 1, err
        assert sha256(out) == b_hash  # B's output was not overwritten
    assert_out_complete(out, source)
    assert not temporaries(tmp_path)


def test_many_concurrent_migrations_to_one_out(tmp_path, source):
    """Four processes at once, no hooks: one writes OUT, the others refuse; nothing is corrupt."""
    out = tmp_path / "out.pth"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-m", "ckpt_tool", "migrate", str(source), "-o", str(out), "--device",
                               "cpu"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
    assert sum(code == 0 for code, _ in results) >= 1, results
    for code, err in results:
        assert code in (0, 2), results
        if code == 2:
            assert "--force" in err and len(err.strip().splitlines()) == 1, err
    assert_out_complete(out, source)
    assert not temporaries(tmp_path)
