"""Shared by the reliability tests (limits, fuzzing, crash consistency, security everywhere).

Everything here runs ckpt the way users do: ``ckpt_tool.cli.main`` in-process
(fast) or ``python -m ckpt_tool`` in a subprocess (signals, limits, hangs).
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.helpers.errors import INTERNAL_ERROR

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"



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

    out, err = _STREAMS  # reused: click keeps a wrapper alive per stream object it has seen
    for s in _STREAMS:
        s.seek(0)
        s.truncate()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), watchdog(seconds):
        code = main(list(args))
    return Result(code, out.getvalue(), err.getvalue())


_STREAMS = (io.StringIO(), io.StringIO())


def run_ckpt(args: Sequence[str], *, timeout: float = 120, env: dict[str, str] | None = None,
             preexec_fn=None, cwd: str | None = None) -> Result:
    """``python -m ckpt_tool ARGS`` in a fresh interpreter; a hang fails with code 'timeout'."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("CKPT_DEBUG", None)
    if env:
        full_env.update(env)
    try:
        p = subprocess.run([sys.executable, "-m", "ckpt_tool", *args], capture_output=True, text=True, check=False,
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
