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
    import ckpt_tool.commands.diff.command
    import ckpt_tool.commands.inspect.command

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
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
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
                          check=False, capture_output=True, text=True, cwd=ROOT, timeout=300)


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
    r = subprocess.run([sys.executable, "-c", code, *names], check=False, capture_output=True, text=True)
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
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip() == "ok", r.stderr


# ------------------------------------------------------------------ Python objects: targets, inputs (issue 25)


@pytest.fixture
def tiny():
    import torch
    from models import TinyMLP

    torch.manual_seed(0)
    return TinyMLP()


def test_diff_against_a_module_instance_and_class(fixtures_dir, tiny):
    import torch
    from models import TinyMLP

    path = str(fixtures_dir / "tiny_mlp.pth")
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    result = ckpt_tool.diff(path, target=tiny)
    assert result.equal and result.b_kind == "target" and result.b == "models:TinyMLP"
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())  # described, never modified
    assert ckpt_tool.diff(path, target=TinyMLP).equal
    result = ckpt_tool.diff(path, target=TinyMLP, target_kwargs={"d_out": 6})
    assert not result.equal and [m.key for m in result.shape_mismatch] == ["head.weight", "head.bias"]
    assert "models:TinyMLP" in str(result)


def test_inputs_may_be_state_dicts_or_modules(fixtures_dir, tiny):
    import torch

    path = str(fixtures_dir / "tiny_mlp.pth")
    saved = torch.load(path)
    assert ckpt_tool.diff(saved, path, values=True).equal  # the same values, one side in memory
    tiny.load_state_dict(saved)
    assert ckpt_tool.diff(tiny, path, values=True).equal
    changed = {k: v.clone() for k, v in saved.items()}
    changed["head.bias"] += 1
    result = ckpt_tool.diff(path, changed, values=True)
    assert [v.key for v in result.value_mismatch] == ["head.bias"]
    assert result.value_mismatch[0].max_abs == pytest.approx(1.0)
    container = ckpt_tool.inspect({"model": saved, "epoch": 3}, key="model")  # a container, located as in a file
    assert container.checkpoint.state_dict_key == "model" and container.checkpoint.metadata["epoch"] == 3
    assert ckpt_tool.diff({"model": saved, "epoch": 3}, path).equal
    assert ckpt_tool.diff(saved, target=type(tiny)).equal


def test_inspect_a_state_dict_and_a_module(fixtures_dir, tiny):
    import torch

    from_file = ckpt_tool.inspect(str(fixtures_dir / "tiny_mlp.pth"))
    in_memory = ckpt_tool.inspect(torch.load(str(fixtures_dir / "tiny_mlp.pth")))
    view = [(t.key, t.dtype, t.shape) for t in in_memory.checkpoint.tensors]
    assert view == [(t.key, t.dtype, t.shape) for t in from_file.checkpoint.tensors]
    assert in_memory.checkpoint.format == ckpt_tool.Format.IN_MEMORY == "in-memory"
    assert in_memory.file_bytes == from_file.checkpoint.total_nbytes
    assert "<state_dict>" in str(in_memory) and "tensors" in str(in_memory)
    module = ckpt_tool.inspect(tiny, stats=True)
    assert module.checkpoint.path == "<TinyMLP.state_dict()>" and module.stats is not None
    assert module.stats["head.bias"].mean == pytest.approx(float(tiny.head.bias.detach().mean()))


def test_an_input_that_is_neither_is_one_error():
    with pytest.raises(ckpt_tool.InputError, match="a path, a state dict"):
        ckpt_tool.inspect(42)  # type: ignore[arg-type]
    with pytest.raises(ckpt_tool.InputError, match="keys are strings"):
        ckpt_tool.inspect({1: 2})  # type: ignore[dict-item]


def test_gate_and_migrate_take_a_module_class(fixtures_dir, tiny, tmp_path):
    from models import TinyMLP

    path = str(fixtures_dir / "tiny_mlp.pth")
    for target in (TinyMLP, tiny):
        report = ckpt_tool.gate([path], target=target)
        (match,) = [c for c in report.files[0].checks if c.name == "matches-target"]
        assert match.passed and not match.skipped and report.passed
    out = tmp_path / "out.safetensors"
    result = ckpt_tool.migrate(str(fixtures_dir / "tiny_mlp_dp.pth"), str(out), target=TinyMLP, auto=True)
    assert result.ok and result.target is not None and result.target.spec == "models:TinyMLP"
    assert result.verified.get("cpu") is True
    with pytest.raises(ckpt_tool.UsageError, match="overwrite the weights"):
        ckpt_tool.migrate(path, str(tmp_path / "x.safetensors"), target=tiny)


def test_reprs_are_one_line_verdicts_and_notebooks_show_the_cli_text(fixtures_dir, tmp_path):
    path = str(fixtures_dir / "tiny_mlp.pth")
    inspect_r = ckpt_tool.inspect(path)
    diff_r = ckpt_tool.diff(str(fixtures_dir / "tiny_mlp_dp.pth"), path)
    gate_r = ckpt_tool.gate([path], sha256="0" * 64)
    scan_r = ckpt_tool.scan([path])
    migrate_r = ckpt_tool.migrate(path, str(tmp_path / "o.safetensors"))
    assert repr(inspect_r) == f"<InspectReport {path!r}: torch-zip, 7 tensors, 245 elements, 980 B>"
    assert repr(diff_r).startswith("<DiffReport ") and "7 missing keys, 7 unexpected keys>" in repr(diff_r)
    assert repr(gate_r) == "<GateReport FAILED: 1 of 1 checkpoint (sha256)>"
    assert repr(scan_r) == "<ScanReport 1 file: safe 1>"
    assert repr(migrate_r).endswith("7 tensors, written, verified on cpu>")
    for r in (inspect_r, diff_r, gate_r, scan_r, migrate_r):
        assert "\n" not in repr(r) and len(repr(r)) < 300

    class Printer:  # IPython's pretty printer, as far as _repr_pretty_ uses it
        def __init__(self) -> None:
            self.out = ""

        def text(self, text: str) -> None:
            self.out += text

    p = Printer()
    gate_r._repr_pretty_(p, False)
    assert p.out == str(gate_r)


def test_a_path_input_still_imports_no_torch(fixtures_dir):
    code = (f"import sys, ckpt_tool; ckpt_tool.inspect({str(fixtures_dir / 'tiny_mlp.safetensors')!r}); "
            f"ckpt_tool.diff({str(fixtures_dir / 'tiny_mlp.safetensors')!r}, "
            f"{str(fixtures_dir / 'tiny_mlp.safetensors')!r}); assert 'torch' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="needs mypy")
def test_object_inputs_and_targets_are_typed(tmp_path):
    right = tmp_path / "objects.py"
    right.write_text("import ckpt_tool\nfrom torch import nn\nm = nn.Linear(2, 2)\n"
                     "ckpt_tool.diff(m.state_dict(), m, values=True)\nckpt_tool.diff('a.pth', target=nn.Linear, "
                     "target_kwargs={'in_features': 2, 'out_features': 2})\nckpt_tool.gate(['a.pth'], target=m)\n"
                     "ckpt_tool.inspect(m)\n")
    r = _mypy(right)
    assert r.returncode == 0, r.stdout + r.stderr
    wrong = tmp_path / "wrong_objects.py"
    wrong.write_text("import ckpt_tool\nckpt_tool.diff(42, 'b.pth')\nckpt_tool.gate(['a.pth'], target=3)\n")
    r = _mypy(wrong)
    assert r.stdout.count("[arg-type]") == 2, r.stdout


def test_gate_and_migrate_say_they_read_files(fixtures_dir, tiny, tmp_path):
    import torch

    sd = torch.load(str(fixtures_dir / "tiny_mlp.pth"))
    with pytest.raises(ckpt_tool.UsageError, match="gate checks files and folders"):
        ckpt_tool.gate([sd])  # type: ignore[list-item]
    with pytest.raises(ckpt_tool.UsageError, match="migrate reads SRC from a file"):
        ckpt_tool.migrate(tiny, str(tmp_path / "o.safetensors"))  # type: ignore[arg-type]
    assert not (tmp_path / "o.safetensors").exists()
    assert ckpt_tool.gate(str(fixtures_dir / "tiny_mlp.pth")).passed  # one path, given bare
    with pytest.raises(ckpt_tool.UsageError, match="scan reads the pickles of files"):
        ckpt_tool.scan([sd])  # type: ignore[list-item]


def test_the_fix_for_an_in_memory_a_names_a_file_to_save_it_to(fixtures_dir, tmp_path):
    import torch

    saved = torch.load(str(fixtures_dir / "tiny_mlp.pth"))
    prefixed = {f"module.{k}": v for k, v in saved.items()}
    result = ckpt_tool.diff(prefixed, str(fixtures_dir / "tiny_mlp.pth"))
    command = result.migrate_command()
    assert command is not None and command.startswith("ckpt migrate a.pth ") and "--strip-prefix module." in command
    assert "torch.save(state_dict, 'a.pth')" in str(result)
    torch.save(prefixed, tmp_path / "a.pth")  # as the line says: then the printed command runs and fixes it
    args = command.split()[2:]
    args[args.index("a.pth")] = str(tmp_path / "a.pth")
    if "-o" in args:
        args[args.index("-o") + 1] = str(tmp_path / "fixed.safetensors")
    else:
        args += ["-o", str(tmp_path / "fixed.safetensors")]
    from ckpt_tool.cli import main

    assert main(["migrate", *args]) == 0
    assert ckpt_tool.diff(str(tmp_path / "fixed.safetensors"), str(fixtures_dir / "tiny_mlp.pth"), values=True).equal


def test_the_command_for_rules_given_to_an_in_memory_a_says_to_save_it_first(fixtures_dir):
    import torch

    from ckpt_tool.keys.rules import RuleSet

    saved = torch.load(str(fixtures_dir / "tiny_mlp.pth"))
    prefixed = {f"module.{k}": v for k, v in saved.items()}
    text = str(ckpt_tool.diff(prefixed, str(fixtures_dir / "tiny_mlp.pth"), rules=RuleSet(("module.",))))
    lines = text.splitlines()
    at = lines.index("to write A with the keys it was compared under:")
    assert "torch.save(state_dict, 'a.pth')" in lines[at + 1]
    assert lines[at + 2].strip().startswith("ckpt migrate a.pth ") and "<state_dict>" not in lines[at + 2]
