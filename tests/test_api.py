"""The Python API mirrors the commands and stays callable after submodules load."""
from __future__ import annotations

import subprocess
import sys

import ckpt_tool


def test_api_functions_survive_submodule_imports(fixtures_dir):
    import ckpt_tool.commands.diff.diff  # noqa: F401 - binds nothing over the API function
    import ckpt_tool.commands.inspect.inspect  # noqa: F401

    for _ in range(2):
        report = ckpt_tool.inspect(str(fixtures_dir / "tiny_mlp.pth"))
        assert len(report.checkpoint.tensors) == 7
    result = ckpt_tool.diff(str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp.safetensors"))
    assert result.equal
    from ckpt_tool import diff, load

    assert callable(diff) and load(str(fixtures_dir / "tiny_mlp.safetensors")).format == "safetensors"


def test_import_is_light():
    code = "import sys, ckpt_tool; assert 'torch' not in sys.modules; assert 'ckpt_tool.commands.migrate.migrate' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_every_module_imports_in_a_fresh_interpreter():
    import pkgutil

    names = [m.name for m in pkgutil.walk_packages(ckpt_tool.__path__, "ckpt_tool.") if not m.name.endswith("__main__")]
    code = "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)"
    r = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(names) > 20


def test_version_matches_cli(run_cli):
    r = run_cli("--version")
    assert r.code == 0 and ckpt_tool.__version__ in r.out
