"""An interrupt between creating a temporary output and locking it leaves nothing behind (issue 21).

io/atomic/write.py creates the temporary and then takes its lock. Python can raise
KeyboardInterrupt between any two bytecodes, so Ctrl-C landing between the
two once left the temporary behind (tests/commands/migrate/test_crash.py's timed Ctrl-C test
failed now and then). The fault is injected exactly there: the lock call
(``staletemp.hold``) first checks that the temporary exists, then either
sends this process a real SIGINT or raises KeyboardInterrupt itself.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ckpt_tool.io.atomic import staletemp, write as atomic

ROOT = Path(__file__).resolve().parents[3]


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if staletemp.TEMP_MARK in p.name)


def _interrupt_at_lock(monkeypatch, how: str) -> list[str]:
    """Make the lock call interrupt once; returns the paths it saw existing when it fired."""
    real_hold = staletemp.hold
    seen: list[str] = []

    def hold(path: str) -> staletemp.Lock:
        if not seen:
            assert os.path.lexists(path), "the hook must run after the temporary was created"
            seen.append(path)
            if how == "sigint":
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered before the lock is taken
            else:
                raise KeyboardInterrupt
        return real_hold(path)

    monkeypatch.setattr(staletemp, "hold", hold)
    return seen


@pytest.mark.parametrize("how", ["sigint", "raise"])
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_interrupt_between_create_and_lock_leaves_no_temporary(tmp_path, monkeypatch, how, kind):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C raises KeyboardInterrupt here
    seen = _interrupt_at_lock(monkeypatch, how)
    out = tmp_path / ("out.pth" if kind == "file" else "out")
    body_ran = []
    with pytest.raises(KeyboardInterrupt), (atomic.AtomicFile(str(out)) if kind == "file"
                                            else atomic.AtomicDir(str(out))):
        body_ran.append(True)
    assert seen and staletemp.TEMP_MARK in seen[0]  # the interrupt came between create and lock
    if how == "sigint":  # held back until the temporary was locked and owned, then removed by its cleanup
        assert not os.path.lexists(seen[0])
    assert body_ran == []
    assert _temporaries(tmp_path) == [] and not out.exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler was put back


def test_a_signal_held_back_is_delivered_once_to_the_handler_in_force(tmp_path):
    from ckpt_tool.io.atomic.interrupts import deferred_interrupts

    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    try:
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            assert got == []  # not yet
        assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, old)


def test_temporary_still_works_normally(tmp_path):
    out = tmp_path / "x.bin"
    with atomic.AtomicFile(str(out)) as tmp:
        os.write(tmp.fd, b"hello")
        tmp.publish()
    assert out.read_bytes() == b"hello" and _temporaries(tmp_path) == []
    folder = tmp_path / "set"
    with atomic.AtomicDir(str(folder)) as d:
        fd = d.create("a.bin")
        os.write(fd, b"a")
        os.close(fd)
        d.publish()
    assert (folder / "a.bin").read_bytes() == b"a" and _temporaries(tmp_path) == []


DRIVER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from ckpt_tool.io.atomic import staletemp
    real = staletemp.hold
    fired = []
    def hold(path):
        if not fired:
            fired.append(path)
            open(sys.argv[2], "w").write(path if os.path.lexists(path) else "")
            os.kill(os.getpid(), signal.SIGINT)
        return real(path)
    staletemp.hold = hold
    from ckpt_tool.cli import main
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.parametrize("name", ["out.safetensors", "out_dir"])
def test_ctrl_c_between_create_and_lock_of_a_real_migration(tmp_path, name):
    """`ckpt migrate` in its own process, Ctrl-C exactly between creating the output's temporary and
    locking it: exit 130, one line on stderr, no temporary, no output, the input untouched."""
    src = tmp_path / "src.pth"
    torch.save({f"w{i}": torch.randn(32, 32) for i in range(4)}, src)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    hook = tmp_path / "hook.txt"
    out = tmp_path / name
    extra = ["--max-shard-size", "5KB"] if name == "out_dir" else []
    r = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), str(hook), "migrate", str(src), "-o", str(out),
                        "--device", "cpu", *extra], check=False, capture_output=True, text=True, timeout=120)
    assert hook.read_text() and staletemp.TEMP_MARK in hook.read_text()  # it fired with the temporary present
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 1, r.stderr
    assert _temporaries(tmp_path) == [] and not out.exists()
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before
