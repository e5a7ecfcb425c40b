"""Issue 32: TorchScript code that torch.jit.load runs is judged op by op (pickles/script/).

Real archives written by torch.jit.script + torch.jit.save (tests/pickles/script_cases.py):
each hostile one is first loaded by the real torch.jit.load in a subprocess, which
must perform its side effect (create the file, set the seed), then ckpt's scan,
gate and inspect must name the call with the method and line that reach it.
Benign archives load with no side effect and are safe.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest

from ckpt_tool import gate, inspect, scan
from ckpt_tool.pickles.script import judge_code
from ckpt_tool.pickles.script.ops import judge_chain, judge_method, table
from tests.pickles import script_cases

_CHILD = textwrap.dedent("""
    import json, os, sys, torch
    out = {}
    for p in sys.argv[1:]:
        before = torch.initial_seed()
        try:
            torch.jit.load(p)
            err = None
        except Exception as exc:  # reported to the parent, which asserts every case loads
            err = f"{type(exc).__name__}: {exc}"[:300]
        out[p] = {"error": err, "seed": torch.initial_seed(), "seed_changed": torch.initial_seed() != before}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, script_cases.Case], dict[str, Path], dict]:
    d = tmp_path_factory.mktemp("script")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hostile = script_cases.hostile(d)
        benign = script_cases.benign(d)
    paths = [str(c.path) for c in hostile.values()] + [str(p) for p in benign.values()]
    before = set(d.iterdir())
    run = subprocess.run([sys.executable, "-c", _CHILD, *paths], capture_output=True, text=True, timeout=300,
                         cwd=d, check=True)
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    loaded["created"] = sorted(str(p) for p in set(d.iterdir()) - before)
    return hostile, benign, loaded


NAMES = ["setstate_from_file", "helper_in_other_file", "submodule_3_deep", "scripted_class_attribute",
         "method_of_scripted_class", "manual_seed", "ops_aten_spelling", "alias", "getattr_literal",
         "string_built_path", "torch_save"]


@pytest.mark.parametrize("name", NAMES)
def test_hostile_load_has_its_effect_and_ckpt_names_it(cases, name: str) -> None:
    hostile, _, loaded = cases
    case = hostile[name]
    real = loaded[str(case.path)]
    assert real["error"] is None, real  # torch.jit.load reads it ...
    if case.creates is not None:  # ... and runs the payload
        assert str(case.creates) in loaded["created"], (name, loaded["created"])
    if case.seed is not None:
        assert real["seed"] == case.seed
    (f,) = scan([str(case.path)]).files
    assert f.verdict == "dangerous"
    named = [g for g in f.globals if g.qualname == case.spelled and g.severity == "dangerous"]
    assert named, f.globals
    assert any(case.function in g.where and ":" in g.where.split(case.function, 1)[1][:2] for g in named), named
    checks = {c.name: c for c in gate([str(case.path)], weights_only_check=False).files[0].checks}
    assert not checks["loads-safely"].passed and case.spelled in checks["loads-safely"].detail
    report = inspect(str(case.path))
    assert any(case.spelled in w and case.function in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("name", ["setstate_math_nested_layers", "setstate_control_flow", "quantized_dynamic",
                                  "quantized_static"])
def test_benign_load_has_no_effect_and_is_safe(cases, name: str) -> None:
    _, benign, loaded = cases
    real = loaded[str(benign[name])]
    assert real["error"] is None and not real["seed_changed"], real
    (f,) = scan([str(benign[name])]).files
    assert f.verdict == "safe", [*f.globals, *f.findings]
    assert gate([str(benign[name])], weights_only_check=False).passed


def test_benign_archives_create_no_file(cases) -> None:
    hostile, _, loaded = cases
    made = {str(c.creates) for c in hostile.values() if c.creates is not None}
    assert set(loaded["created"]) <= made, loaded["created"]


# -- the reading itself, on code as TorchScript prints it or as a hand may write it --------------------
def _judge(body: str) -> list[tuple[str, str, int]]:
    code = "class M(Module):\n  def __setstate__(self: __torch__.M, s: str) -> NoneType:\n" + textwrap.indent(
        textwrap.dedent(body), "    ") + "    return None\n"
    return [(f.spelled, f.judged.kind, f.line) for f in judge_code({"a/code/__torch__.py": code})]


def test_unresolvable_callees_are_unreviewed_never_safe() -> None:
    assert _judge("x = getattr(torch, s)(1)\n")[0][1] == "unreviewed"  # a name built at run time
    assert _judge("x = mystery(1)\n") == [("mystery", "unreviewed", 3)]
    assert _judge("x = __torch__.nowhere.fn(1)\n")[0][1] == "unreviewed"  # code the archive lacks
    assert _judge("x = ops.mylib.evil(1)\n")[0][1] == "unreviewed"  # a custom op of another library
    assert _judge("x = torch.classes.c10d.ProcessGroup(1, 2)\n")[0][1] == "unreviewed"


def test_unparsable_code_is_a_finding_not_a_pass() -> None:
    (f,) = judge_code({"a/code/__torch__.py": "class M(Module):\n  def __setstate__(self) -> None:\n    x = (\n"})
    assert f.judged.kind == "unreviewed" and "parse" in f.judged.reason


def test_calls_are_followed_into_methods_functions_and_constructors() -> None:
    code = textwrap.dedent("""
        class M(Module):
          def __setstate__(self: __torch__.M, s: str) -> NoneType:
            (self).helper(s)
            return None
          def helper(self: __torch__.M, s: str) -> NoneType:
            x = __torch__.lib.C(s)
            return None
        """)
    lib = textwrap.dedent("""
        class C:
          def __init__(self: __torch__.lib.C, s: str) -> NoneType:
            self.t = ops.aten.save(torch.zeros([1]), s)
            return None
        """)
    (f,) = judge_code({"a/code/__torch__.py": code, "a/code/__torch__/lib.py": lib})
    assert (f.spelled, f.judged.op, f.function, f.entry) == ("ops.aten.save", "aten::save", "__torch__.lib.C.__init__",
                                                              "__torch__.M.__setstate__")


def test_forward_alone_runs_nothing_at_load() -> None:
    code = ("class M(Module):\n  def forward(self: __torch__.M) -> NoneType:\n"
            "    torch.manual_seed(1)\n    return None\n")
    assert judge_code({"a/code/__torch__.py": code}) == []


def test_table_spellings() -> None:
    assert judge_chain(["torch", "nn", "functional", "relu"]).kind == "allowed"
    assert judge_chain(["torch", "linalg", "norm"]).op == "aten::linalg_norm"
    assert judge_chain(["ops", "aten", "add", "Tensor"]).kind == "allowed"
    assert judge_chain(["torch", "ops", "aten", "from_file", "default"]).kind == "denied"
    assert judge_method("copy_").kind == "allowed" and judge_method("unpack").kind == "allowed"
    assert judge_method("wait").kind == "denied"
    t = table()
    assert {"aten::from_file", "aten::save", "aten::manual_seed", "prim::rpc_sync"} <= set(t.denied)
    assert len(t.allowed) > 2000


def test_a_name_defined_twice_is_read_twice() -> None:
    code = textwrap.dedent("""
        def helper(s: str) -> NoneType:
          return None
        def helper(s: str) -> NoneType:
          torch.save(torch.zeros([1]), s)
          return None
        class M(Module):
          def __setstate__(self: __torch__.M, s: str) -> NoneType:
            __torch__.helper(s)
            return None
        """)
    assert [f.spelled for f in judge_code({"a/code/__torch__.py": code})] == ["torch.save"]


def test_a_denied_operator_is_named_even_when_an_archive_class_has_a_method_of_its_name() -> None:
    code = textwrap.dedent("""
        class Decoy:
          def save(self: __torch__.Decoy, t: Tensor, s: str) -> NoneType:
            return None
        class M(Module):
          def __setstate__(self: __torch__.M, s: str) -> NoneType:
            x = __torch__.Decoy.__new__(__torch__.Decoy)
            (x).save(torch.zeros([1]), s)
            return None
        """)
    assert [(f.spelled, f.judged.kind) for f in judge_code({"a/code/__torch__.py": code})] == [(".save()", "denied")]


def test_inspect_reads_code_laid_out_by_hand(tmp_path: Path) -> None:
    """torch.jit.load compiles any layout Python allows: four-space bodies, blank lines, a list over lines."""
    import torch

    src = tmp_path / "src.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 3)), str(src))
    out = tmp_path / "relaid.pt"
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zo:
        for name in zi.namelist():
            data = zi.read(name)
            if name.endswith(".py") and "/code/" in name:
                text = data.decode().replace("\n  ", "\n\n    ").replace('__parameters__ = ["weight", "bias", ]',
                                                                          '__parameters__ = [\n      "weight",\n'
                                                                          '      "bias", ]')
                assert "\n\n    __parameters__ = [\n" in text
                data = text.encode()
            zo.writestr(name, data)
    loaded = torch.jit.load(str(out))
    assert sorted(loaded.state_dict()) == ["bias", "weight"]
    report = inspect(str(out))
    assert sorted(t.key for t in report.checkpoint.tensors) == ["bias", "weight"]
    assert scan([str(out)]).files[0].verdict == "safe"


def test_code_nested_past_the_parsers_limits_is_unreviewed_not_a_crash() -> None:
    (f,) = _judge_raw("    y = x" + "+x" * 200_000 + "\n")
    assert f.judged.kind == "unreviewed" and "RecursionError" in f.judged.reason
    (g,) = _judge_raw("    y = (self.fns)[0](s)\n")
    assert g.judged.kind == "unreviewed" and g.spelled == "<call of a Subscript expression>"


def _judge_raw(body: str) -> list:
    code = "class M(Module):\n  def __setstate__(self: __torch__.M, s: str) -> NoneType:\n" + body + "    return None\n"
    return judge_code({"a/code/__torch__.py": code})


def test_every_function_of_torchs_scriptable_nn_modules_reads_clean() -> None:
    """The benign corpus by class: every nn module torch can script and save, every function of its code
    (forward included) read as if load ran it: no operator or spelling torch prints is outside the table."""
    import io

    import torch
    from torch import nn

    saved, findings = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(dir(nn)):
            cls = getattr(nn, name)
            if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
                continue
            for args in ((), (4,), (4, 4), (4, 4, 3), (4, 2)):
                try:
                    module = cls(*args)
                    break
                except Exception:  # noqa: BLE001  (the constructor's signature is probed, not known)
                    module = None
            buf = io.BytesIO()
            try:
                torch.jit.save(torch.jit.script(module), buf)
            except Exception:  # noqa: BLE001  (a module TorchScript cannot compile is no archive to read)
                continue
            saved += 1
            with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
                files = {n: z.read(n).decode() for n in z.namelist() if "/code/" in n and n.endswith(".py")}
            findings += [(name, f.spelled, f.judged.reason) for f in judge_code(files, every_function=True)]
    assert saved >= 100
    assert findings == []


def test_the_committed_operator_table_is_what_the_generator_writes_for_this_torch() -> None:
    """ops.txt is generated (tools/script_ops.py): a torch upgrade that adds operators shows here."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "tools" / "script_ops.py")], capture_output=True, text=True,
                         timeout=300, check=True)
    committed = (root / "ckpt_tool" / "pickles" / "script" / "ops.txt").read_text(encoding="utf-8")
    assert run.stdout == committed, "regenerate: python tools/script_ops.py > ckpt_tool/pickles/script/ops.txt"


def test_a_local_or_parameter_called_is_unreviewed_even_under_a_builtins_name() -> None:
    code = ("class M(Module):\n  def __setstate__(self: __torch__.M, s: str, print: Any) -> NoneType:\n"
            "    print(s)\n    return None\n")
    assert [(f.spelled, f.judged.kind) for f in judge_code({"a/code/__torch__.py": code})] == [("print", "unreviewed")]
    assert _judge_raw("    len = self.fn\n    y = len(s)\n")[0].spelled == "len"
    assert _judge_raw("    y = len(s)\n    print(y)\n") == []


REFUSED = {  # spellings torch's TorchScript compiler refuses in an archive's code (measured below)
    "set_num_threads": ("torch.set_num_threads(1)", "torch.set_num_threads"),
    "set_default_dtype": ("torch.set_default_dtype(torch.float64)", "torch.set_default_dtype"),
    "load_library": ('torch.ops.load_library("/nonexistent/lib.so")', "torch.ops.load_library"),
}


def test_what_torch_refuses_to_compile_is_still_never_safe(tmp_path: Path) -> None:
    """torch.jit.load refuses these (not TorchScript operators); ckpt, reading statically, names them
    unreviewed: dangerous, never safe (the static reading does not depend on what this torch compiles)."""
    paths = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = script_cases._save(script_cases.FromFile(str(tmp_path / "unused")), tmp_path / "base.pt")
        for name, (line, _) in REFUSED.items():
            paths[name] = script_cases._edit(base, tmp_path / f"{name}.pt", line + "\n    self.w = (s)[0]")
    run = subprocess.run([sys.executable, "-c", _CHILD, *map(str, paths.values())], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, check=True)
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    for name, path in paths.items():
        assert loaded[str(path)]["error"], name  # torch refuses to compile it
        (f,) = scan([str(path)]).files
        assert f.verdict == "dangerous"
        assert any(g.qualname == REFUSED[name][1] and "__setstate__:" in g.where for g in f.globals), f.globals
