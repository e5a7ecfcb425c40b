"""Killing ckpt migrate mid-write never touches SRC and never leaves a partial OUT.

A subprocess runs the real command; its progress hook (installed by the test
script, not by ckpt) writes a marker after the first tensor is written and
then waits, so the signal arrives while the output is half written.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import dataclasses, importlib, sys, time
m = importlib.import_module("ckpt_tool.commands.migrate")  # the CLI imports run_migration from the package
marker = sys.argv[1]

class Stall:
    def __init__(self):
        self.writing = False
    def start(self, label, total):
        self.writing = label == "writing"
    def advance(self, n):
        if self.writing:
            open(marker, "w").close()
            time.sleep(600)
    def done(self):
        pass

orig = m.run_migration
m.run_migration = lambda src, out, source, options, hooks: orig(src, out, source, options,
                                                                 dataclasses.replace(hooks, progress=Stall()))
from ckpt_tool.cli import main
sys.exit(main(sys.argv[2:]))
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_until_marker(tmp_path: Path, *args: str) -> subprocess.Popen:
    marker = tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker), "migrate", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"migrate ended before writing: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("migrate never started writing")
        time.sleep(0.05)
    return proc


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "model.pth"
    path.parent.mkdir()
    torch.save({f"module.layer{i}.weight": torch.randn(64, 64) for i in range(6)}, path)
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("ext", [".pth", ".safetensors", "_shards"])
def test_interrupt_leaves_src_intact_and_nothing_behind(tmp_path, src, sig, ext):
    before = sha256(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / f"model{ext}"
    extra = ["--max-shard-size", "20KB"] if ext == "_shards" else []
    proc = run_until_marker(tmp_path, str(src), "-o", str(out), "--strip-prefix", "module.", *extra)
    assert [p.name for p in out_dir.iterdir() if ".ckpt-tmp-" in p.name]  # really mid-write
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "ckpt: interrupted" in err and "Traceback" not in err
    assert sha256(src) == before
    assert not out.exists()
    assert list(out_dir.iterdir()) == []  # the temporary output was removed too


def test_sigkill_leaves_src_intact_and_no_output_and_a_rerun_succeeds(tmp_path, src, run_cli):
    before = sha256(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "model.safetensors"
    proc = run_until_marker(tmp_path, str(src), "-o", str(out), "--strip-prefix", "module.")
    proc.kill()
    proc.communicate(timeout=120)
    assert sha256(src) == before
    assert not out.exists()
    # SIGKILL cannot be caught: only a hidden temporary can remain, never OUT
    assert all(p.name.startswith(".model.ckpt-tmp-") for p in out_dir.iterdir())
    r = run_cli("migrate", str(src), "-o", str(out), "--strip-prefix", "module.")
    assert r.code == 0, r
    assert out.exists()
