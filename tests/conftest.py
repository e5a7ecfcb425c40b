"""Shared fixtures: real checkpoints written by real torch, and a CLI runner."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
sys.path.insert(0, str(FIXTURES))

# The suite starts ckpt in fresh interpreters hundreds of times (the CLI in a subprocess, the parity
# harness, the crash driver). With PYTHONDONTWRITEBYTECODE set (these machines set it) each one compiles
# the package's ~100 modules again, 10-15 ms a start that tests nothing; an installed package has its
# bytecode. The subprocesses share one cache outside the tree instead.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), f"ckpt-tests-pycache-{os.getuid()}"))


def computed_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> tuple[Path, object]:
    """``build(folder)`` run once for the whole session, xdist workers included: (folder, its JSON result).

    Under pytest-xdist each worker runs every session fixture again; the expensive ones (a subprocess
    that imports a library for seconds) are built by the first worker to ask, under a lock, in the
    session's shared temporary folder, and read back by the others (the pattern of xdist's docs). Without
    xdist it is a plain ``mktemp``. A build that fails leaves no ``done.json``: the next worker retries.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the parent of basetemp is shared by every pytest session
        folder = factory.mktemp(name)
        return folder, build(folder)
    root = factory.getbasetemp().parent
    folder, done = root / f"once-{name}", root / f"once-{name}.json"  # beside it: nothing a test reads
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            result = build(folder)
            done.write_text(json.dumps(result))
        return folder, json.loads(done.read_text())


def _write_hf_folders(out: Path) -> object:
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "hf_writers.py"), str(out)],
                       check=False, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def hf_written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """The folders Hugging Face libraries write (tests/helpers/hf_writers.py, one subprocess a session, shared by
    the xdist workers): the output folder, and layout -> folder (or {"skipped": why} where its library is
    not installed)."""
    out, got = computed_once(tmp_path_factory, "hf-folders", _write_hf_folders)
    assert isinstance(got, dict)
    return out, got


def hf_folder(written: tuple[Path, dict[str, object]], layout: str) -> tuple[Path, Path]:
    """(the folder of ``layout``, the library's own state_dict of it); skips where its library is missing."""
    out, got = written
    where = got[layout]
    if isinstance(where, dict):
        pytest.skip(f"{layout}: {where['skipped']}")
    return Path(str(where)), out / "expected" / f"{layout}.safetensors"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


def cli(*args: str) -> CliResult:
    """Run ``ckpt ARGS`` in-process through main(), as ``run_cli`` does (for module-scoped fixtures)."""
    from ckpt_tool.cli import main

    result = CliRunner().invoke(_Main(main), list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def run_cli():
    """Run ``ckpt ARGS`` in-process through main(); returns (exit code, stdout, stderr)."""
    return cli


class _Main:
    """Adapter so CliRunner can drive ``main(argv) -> int`` (our error mapping included)."""

    def __init__(self, main):
        self.main_func = main
        self.name = "ckpt"

    def main(self, args=None, prog_name=None, standalone_mode=True, **extra):
        code = self.main_func(args)
        sys.exit(code)


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[:400]!r}, err={self.err[:400]!r})"


def run_subprocess(*args: str, cwd: str | None = None, timeout: float = 120, env: dict | None = None):
    """Run ``python -m ckpt_tool ARGS`` in a fresh interpreter."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tool", *args], check=False, capture_output=True, text=True, cwd=cwd,
        timeout=timeout, env=full_env,
    )



def pytest_configure(config: pytest.Config) -> None:
    """Before the xdist workers start: let yapf (imported by mmengine) write its grammar cache once.

    yapf rebuilds ~/.cache/YAPF/*.pickle when its grammar file is newer (a fresh venv); two workers importing
    mmengine at once then race, one reading the other's half-written pickle (EOFError)."""
    if hasattr(config, "workerinput"):
        return
    import importlib.util

    if importlib.util.find_spec("yapf") is not None:
        import yapf  # noqa: F401 - its import loads (and caches) the grammar
