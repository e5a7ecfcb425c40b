"""Shared by the reliability tests (limits, fuzzing, crash consistency, security everywhere).

Everything here runs ckpt the way users do: ``ckpt_tool.cli.main`` in-process
(fast) or ``python -m ckpt_tool`` in a subprocess (signals, limits, hangs).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# A seed of every format ckpt reads, from the committed fixtures: (name, path inside
# fixtures/, file to mutate relative to that path or "" for the path itself).
SEEDS = [
    ("torch-zip", "tiny_mlp.pth", ""),
    ("torch-zip-training", "training.pth", ""),
    ("torch-zip-whole-model", "whole_model.pth", ""),
    ("lightning", "lightning.ckpt", ""),
    ("torchscript", "torchscript.pt", ""),
    ("legacy", "legacy.pth", ""),
    ("safetensors", "tiny_mlp.safetensors", ""),
    ("pickle-numpy", "numpy_dict.pkl", ""),
    ("dill", "dill_model.dill", ""),
    ("sharded-safetensors", "sharded", "model.safetensors.index.json"),
    ("sharded-shard", "sharded", "model-00001-of-00002.safetensors"),
    ("sharded-bin", "sharded_bin", "pytorch_model-00001-of-00002.bin"),
    ("dcp-metadata", "dcp", ".metadata"),
    ("dcp-shard", "dcp", "__0_0.distcp"),
]

INTERNAL_ERROR = re.compile(r"unexpected \w+(Error|Exception|Warning|Exit|Interrupt)\b")


def copy_seed(seed: str, folder: Path) -> tuple[Path, Path]:
    """(path to give ckpt, file inside it to mutate), copied into ``folder``."""
    name, rel, inner = next(s for s in SEEDS if s[0] == seed)
    src = FIXTURES / rel
    dst = folder / rel
    if src.is_dir():
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        return dst, dst / inner
    shutil.copyfile(src, dst)
    return dst, dst


class Result:
    def __init__(self, code: int | str, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    def __repr__(self) -> str:
        return f"Result(code={self.code!r}, out={self.out[:300]!r}, err={self.err[:600]!r})"


class Hang(Exception):
    """A watchdog fired: the command ran far longer than any input justifies."""


@contextlib.contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Turn a hang in Python code into a test failure (SIGALRM; main thread only)."""
    def fire(signum: int, frame: object) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_main(args: Sequence[str], seconds: int = 60) -> Result:
    """``ckpt ARGS`` in-process through main(); stdout and stderr captured."""
    from ckpt_tool.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), watchdog(seconds):
        code = main(list(args))
    return Result(code, out.getvalue(), err.getvalue())


def run_ckpt(args: Sequence[str], *, timeout: float = 120, env: dict[str, str] | None = None,
             preexec_fn=None, cwd: str | None = None) -> Result:
    """``python -m ckpt_tool ARGS`` in a fresh interpreter; a hang fails with code 'timeout'."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("CKPT_DEBUG", None)
    if env:
        full_env.update(env)
    try:
        p = subprocess.run([sys.executable, "-m", "ckpt_tool", *args], capture_output=True, text=True,
                           timeout=timeout, env=full_env, preexec_fn=preexec_fn, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        return Result("timeout", str(exc.stdout or ""), str(exc.stderr or ""))
    return Result(p.returncode, p.stdout, p.stderr)


def problems(r: Result, allowed: Sequence[int] = (0, 1, 2)) -> list[str]:
    """What is wrong with a run on hostile input (empty when it behaved)."""
    found = []
    if r.code not in allowed:
        found.append(f"exit code {r.code!r}")
    lines = r.err.strip().splitlines()
    if len(lines) > 1:
        found.append(f"{len(lines)} lines on stderr")
    if "Traceback" in r.err:
        found.append("a traceback")
    if INTERNAL_ERROR.search(r.err):
        found.append("an internal error")
    if r.code == 2 and not lines:
        found.append("exit 2 without a message")
    return found


def assert_one_line_error(r: Result, *needles: str) -> None:
    assert r.code == 2, r
    assert not problems(r), (problems(r), r)
    for n in needles:
        assert n in r.err, (n, r)
