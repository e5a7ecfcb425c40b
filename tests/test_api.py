"""The Python API mirrors the commands, is typed as they are, and prints what the CLI prints."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ckpt_tool

ROOT = Path(__file__).resolve().parent.parent


def test_api_functions_survive_submodule_imports(fixtures_dir):
    import ckpt_tool.commands.diff.command  # noqa: F401 - binds nothing over the API function
    import ckpt_tool.commands.inspect.command  # noqa: F401

    for _ in range(2):
        report = ckpt_tool.inspect(str(fixtures_dir / "tiny_mlp.pth"))
        assert len(report.checkpoint.tensors) == 7
    result = ckpt_tool.diff(str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "tiny_mlp.safetensors"))
    assert result.equal
    from ckpt_tool import diff, load

    assert callable(diff) and load(str(fixtures_dir / "tiny_mlp.safetensors")).format == "safetensors"


def test_import_is_light():
    code = ("import sys, ckpt_tool; assert 'torch' not in sys.modules, 'torch'; "
            "loaded = [m for m in sys.modules if m.startswith(('ckpt_tool.commands', 'ckpt_tool.api', "
            "'ckpt_tool.formats', 'ckpt_tool.render'))]; assert not loaded, loaded")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_public_name_resolves_and_is_listed():
    import ckpt_tool as api

    assert set(api._LAZY) <= set(api.__all__)
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert set(api.__all__) <= set(dir(api))
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018 - the lookup is what is tested


def test_results_are_the_commands_reports(fixtures_dir):
    from ckpt_tool.commands.inspect.command import InspectReport

    report = ckpt_tool.inspect(fixtures_dir / "tiny_mlp.pth")
    assert isinstance(report, InspectReport) and isinstance(report, ckpt_tool.InspectReport)
    assert report.to_json()["format"] == "torch-zip" and report.checkpoint.format == ckpt_tool.Format.TORCH_ZIP
    assert ckpt_tool.inspect.__doc__ and "stats" in str(__import__("inspect").signature(ckpt_tool.inspect))


# ------------------------------------------------------------------ str(result) is the CLI's text


def _same_text(run_cli, result, *argv: str) -> None:
    r = run_cli(*argv)
    assert r.out == str(result) + "\n", (r.out, str(result))


def test_str_of_inspect_is_the_cli_text(run_cli, fixtures_dir):
    path = str(fixtures_dir / "training.pth")
    _same_text(run_cli, ckpt_tool.inspect(path), "inspect", path)


def test_str_of_diff_is_the_cli_text(run_cli, fixtures_dir):
    a, b = str(fixtures_dir / "tiny_mlp_dp.pth"), str(fixtures_dir / "tiny_mlp.safetensors")
    _same_text(run_cli, ckpt_tool.diff(a, b), "diff", a, b)


def test_str_of_scan_is_the_cli_text(run_cli, fixtures_dir):
    paths = [str(fixtures_dir / "tiny_mlp.pth"), str(fixtures_dir / "whole_model.pth")]
    result = ckpt_tool.scan(paths)
    _same_text(run_cli, result, "scan", *paths)
    assert result.exit_code == run_cli("scan", *paths).code


def test_str_of_gate_is_the_cli_text(run_cli, fixtures_dir):
    path = str(fixtures_dir / "tiny_mlp.safetensors")
    result = ckpt_tool.gate([path], allowed_float_dtypes=["float32"])
    _same_text(run_cli, result, "gate", path, "--allow-dtype", "float32")
    assert result.exit_code == 0


def test_str_of_migrate_is_the_cli_text(run_cli, fixtures_dir, tmp_path):
    src = str(fixtures_dir / "tiny_mlp_dp.pth")
    result = ckpt_tool.migrate(src, str(tmp_path / "a.safetensors"), strip_prefix=["module."])
    r = run_cli("migrate", src, "-o", str(tmp_path / "b.safetensors"), "--strip-prefix", "module.")
    assert r.code == 0 and result.ok
    assert r.out == str(result).replace("a.safetensors", "b.safetensors") + "\n"


def test_str_of_doctor_is_the_cli_text(run_cli):
    def untimed(text: str) -> str:
        return re.sub(r"[\d.]+ ms\b", "T ms", text)

    assert untimed(run_cli("doctor").out) == untimed(str(ckpt_tool.doctor()) + "\n")


# ------------------------------------------------------------------ the types are real


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict on one file; ckpt_tool's own modules are analysed for their types, not reported on."""
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(ROOT / ".mypy_cache"), str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="needs mypy")
def test_the_typed_example_of_docs_api_passes_mypy_strict(tmp_path):
    text = (ROOT / "docs" / "api.md").read_text()
    example = tmp_path / "example.py"
    example.write_text(text.split("```python\n", 1)[1].split("```", 1)[0])
    r = _mypy(example)
    assert r.returncode == 0, r.stdout + r.stderr
    wrong = tmp_path / "wrong.py"  # and the types are real: a misspelt keyword and a wrong result are errors
    wrong.write_text("import ckpt_tool\nckpt_tool.inspect('m.pth', stat=True)\nn: int = ckpt_tool.load('m.pth')\n")
    r = _mypy(wrong)
    assert 'Unexpected keyword argument "stat"' in r.stdout and '"Checkpoint"' in r.stdout, r.stdout


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


def test_the_import_paths_of_before_the_package_split_still_give_the_same_objects():
    """docs/migrate.md and docs/diff.md import the commands from their packages (issue 22 kept these paths)."""
    code = """
import inspect, ckpt_tool
from ckpt_tool.commands.migrate import migrate, MigrateReport
from ckpt_tool.commands.diff import diff, compare_tensors, DiffReport
from ckpt_tool.commands.inspect import inspect as inspect_cmd, InspectReport
from ckpt_tool.commands.gate import gate, GateReport
from ckpt_tool.commands.scan import scan, ScanReport
from ckpt_tool.commands.doctor import run_doctor, DoctorReport
from ckpt_tool.keys.infer import suggest
from ckpt_tool.tensors.target import build_target
from ckpt_tool.formats import load
assert all(inspect.isfunction(f) for f in (migrate, diff, compare_tensors, inspect_cmd, gate, scan, run_doctor,
                                           suggest, build_target, load))
assert issubclass(ckpt_tool.MigrateReport, MigrateReport) and issubclass(ckpt_tool.InspectReport, InspectReport)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "ok", r.stderr
