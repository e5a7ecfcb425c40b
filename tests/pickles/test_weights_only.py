"""Differential test: ckpt's weights_only prediction against the installed torch's real torch.load.

Every case is written by real ``torch.save``; one fresh interpreter then runs
``torch.load(weights_only=True)`` on all of them and, for the clean ones that
fail, retries inside ``torch.serialization.safe_globals`` with ckpt's
``needs`` resolved by import. Hostile cases are never retried: their payload
would run.
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import os
import pickletools
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from ckpt_tool.pickles.torch_rules.predict import (
    PickleFacts,
    WeightsOnlyVerdict,
    facts_from_pickle,
    predict,
    rules_for,
    torch_version_default,
)

HELPERS = textwrap.dedent(
    '''
    import dataclasses, enum

    class Color(enum.Enum):
        RED = 1
        GREEN = 2

    @dataclasses.dataclass
    class TrainConfig:
        lr: float = 0.1
        layers: tuple = (2, 3)

    class Plain:
        def __init__(self):
            self.name = "run-1"
            self.steps = [1, 2]

    class Slotted:
        __slots__ = ("a", "b")
        def __init__(self):
            self.a, self.b = 1, "two"

    class AttrDict(dict):
        """An EasyDict-like dict subclass: pickled as NEWOBJ + SETITEMS."""

    class Tape(list):
        pass

    class Outer:
        class Inner:
            def __init__(self):
                self.x = 1

    class Bomb:
        def __init__(self, func, *args):
            self.func, self.args = func, args
        def __reduce__(self):
            return self.func, self.args
    '''
)

LOADER = textwrap.dedent(
    '''
    import importlib, json, sys, warnings
    warnings.simplefilter("ignore")
    import torch

    def resolve(path):
        if path.startswith("__main__."):  # the saving script's class: any stand-in class, registered by name
            return type(path.rpartition(".")[2], (), {})
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                obj = getattr(obj, part)
            return obj
        raise ImportError(path)

    def attempt(path, allow):
        try:
            with torch.serialization.safe_globals(allow):
                torch.load(path, weights_only=True)
            return None
        except Exception as exc:  # any refusal is an outcome to report
            lines = [ln for ln in str(exc).splitlines() if "error:" in ln] or str(exc).splitlines()[:1]
            return f"{type(exc).__name__}: {lines[0].strip()[:300]}"

    out = []
    for case in json.load(sys.stdin):
        first = attempt(case["path"], [])
        retry = None
        if first is not None and case["retry"]:
            retry = attempt(case["path"], [(resolve(n), n) for n in case["needs"]])
        out.append({"name": case["name"], "first": first, "retry": retry})
    print(json.dumps(out))
    '''
)


# ---- glue: the facts of a file as ckpt's readers would give them (to move beside the format readers)
def facts_for_file(path: Path) -> tuple[str, list[PickleFacts]]:
    """(container, facts of each pickle torch.load unpickles) for a torch.save/jit.save output."""
    data = path.read_bytes()
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            if any(n.endswith("constants.pkl") for n in names):
                return "torchscript", []
            return "zip", [facts_from_pickle(z.read(next(n for n in names if n.endswith("/data.pkl"))))]
    stream, facts = io.BytesIO(data), []
    for _ in range(5):  # legacy format: magic number, protocol, sys_info, the object, storage keys
        start = stream.tell()
        for _op in pickletools.genops(stream):
            pass
        facts.append(facts_from_pickle(data[start:stream.tell()]))
    return "legacy", facts


def _cases(torch, np, helpers) -> dict[str, tuple[object, dict, bool]]:
    """name -> (object to save, torch.save keywords, clean)."""
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    sd = lin.state_dict()
    main_cls = type("MainCfg", (), {"__module__": "__main__"})
    main_obj = main_cls()
    main_obj.depth = 4
    return {
        "state_dict": (sd, {}, True),
        "training_namespace": ({"model": sd, "optimizer": opt.state_dict(), "epoch": 3,
                                "args": argparse.Namespace(lr=0.1, name="x")}, {}, True),
        "numpy_scalars": ({"model": sd, "loss": np.float64(1.5), "step": np.int64(7), "ok": np.bool_(True)}, {}, True),
        "numpy_arrays": ({"model": sd, "mean": np.arange(3, dtype=np.float32), "idx": np.arange(2)}, {}, True),
        "numpy_dtype": ({"dtype": np.dtype("float16")}, {}, True),
        "enum": ({"model": sd, "color": helpers.Color.GREEN}, {}, True),
        "dataclass": ({"model": sd, "cfg": helpers.TrainConfig()}, {}, True),
        "plain_class": ({"model": sd, "run": helpers.Plain()}, {}, True),
        "slotted_class": ({"s": helpers.Slotted()}, {}, True),
        "nested_class": ({"n": helpers.Outer.Inner()}, {}, True),
        "main_class": ({"model": sd, "cfg": main_obj}, {}, True),
        "defaultdict": ({"counts": collections.defaultdict(list, {"a": [1]})}, {}, True),
        "dict_subclass": ({"hp": helpers.AttrDict(lr=0.1)}, {}, True),
        "list_subclass": ({"tape": helpers.Tape([1, 2])}, {}, True),
        "containers": ({"od": collections.OrderedDict(a=1), "set": {1, 2}, "bytes": b"ab", "ba": bytearray(b"x"),
                        "complex": 1 + 2j, "size": torch.Size([2, 3]), "dtype": torch.bfloat16,
                        "device": torch.device("cpu"), "counter": collections.Counter("aab"),
                        "big": 2 ** 70, "t": (1, "é", None, 1.5)}, {}, True),
        "slice_range_frozenset": ({"s": slice(1, 2), "r": range(3), "f": frozenset([1])}, {}, True),
        "empty_bytes": ({"b": b""}, {}, True),
        "whole_module": (torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), {}, True),
        "parameter": ({"p": torch.nn.Parameter(torch.ones(2))}, {}, True),
        "legacy_state_dict": (sd, {"_use_new_zipfile_serialization": False}, True),
        "legacy_namespace": ({"model": sd, "args": argparse.Namespace(a=1)},
                             {"_use_new_zipfile_serialization": False}, True),
        "protocol_4": ({"model": sd, "epoch": 1}, {"pickle_protocol": 4}, True),
        "legacy_whole_module": (torch.nn.Sequential(torch.nn.Linear(2, 2)), {"_use_new_zipfile_serialization": False},
                                True),  # module classes come from ("module", ...) persistent ids: never loads
        "hostile_os_system": ({"x": helpers.Bomb(os.system, "true")}, {}, False),
        "hostile_popen": ({"x": helpers.Bomb(subprocess.Popen, ["true"])}, {}, False),
        "hostile_eval": ({"x": helpers.Bomb(eval, "1")}, {}, False),
    }


def test_prediction_matches_torch_load(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    (tmp_path / "wo_helpers.py").write_text(HELPERS)
    sys.path.insert(0, str(tmp_path))
    main = sys.modules["__main__"]
    try:
        import wo_helpers

        cases = _cases(torch, np, wo_helpers)
        main_case: dict = cases["main_class"][0]  # type: ignore[assignment]
        setattr(main, "MainCfg", type(main_case["cfg"]))  # noqa: B010  pickle checks the class is reachable by name
        plan, verdicts = [], {}
        for name, (obj, kwargs, clean) in cases.items():
            path = tmp_path / f"{name}.pt"
            torch.save(obj, path, **kwargs)
            container, facts = facts_for_file(path)
            verdict = predict(facts, container=container)
            verdicts[name] = verdict
            plan.append({"name": name, "path": str(path), "needs": list(verdict.needs),
                         "retry": clean and not verdict.loads})
        ts_path = tmp_path / "torchscript.pt"
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), ts_path)
        container, facts = facts_for_file(ts_path)
        verdicts["torchscript"] = predict(facts, container=container)
        plan.append({"name": "torchscript", "path": str(ts_path), "needs": [], "retry": False})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("wo_helpers", None)
        if hasattr(main, "MainCfg"):
            del main.MainCfg

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    proc = subprocess.run([sys.executable, "-c", LOADER], input=json.dumps(plan), capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = {row["name"]: row for row in json.loads(proc.stdout)}

    retried = {p["name"]: p["retry"] for p in plan}
    problems = []
    for name, verdict in verdicts.items():
        row = outcomes[name]
        really_loads = row["first"] is None
        if verdict.loads != really_loads:
            problems.append(f"{name}: predicted loads={verdict.loads}, torch: {row['first'] or 'loads'}")
        if retried[name] and not really_loads:
            fixed = row["retry"] is None
            if verdict.reason is None and not fixed:
                problems.append(f"{name}: needs {verdict.needs} did not make it load: {row['retry']}")
            if verdict.reason is not None and fixed:
                problems.append(f"{name}: predicted never to load ({verdict.reason}) but needs fixed it")
    print(json.dumps(outcomes, indent=0))
    print("\n".join(f"{n}: {v}" for n, v in verdicts.items()))
    fixed_by_needs = {n for n, row in outcomes.items() if row["first"] and retried[n] and row["retry"] is None}
    assert {"training_namespace", "numpy_arrays", "nested_class", "main_class"} <= fixed_by_needs, outcomes
    assert not problems, "\n".join(problems) + "\n" + "\n".join(f"{n}: {v}" for n, v in verdicts.items())


# ---- the version table, without torch
def _facts(obj: object) -> PickleFacts:
    import pickle

    return facts_from_pickle(pickle.dumps(obj, protocol=2))


def test_version_rules() -> None:
    assert rules_for("2.4.1").default_weights_only is False
    assert rules_for("2.6.0+cpu").default_weights_only is True
    assert rules_for("1.13").version == (2, 4) and rules_for("3.1").version == (2, 13)
    assert "builtins.set" not in rules_for("2.4").allowed and "builtins.set" in rules_for("2.5").allowed
    with pytest.raises(ValueError):
        rules_for("nightly")


def test_set_needs_allowlisting_before_2_5() -> None:
    assert predict(_facts({1, 2}), "2.4").needs == ("builtins.set",)
    assert predict(_facts({1, 2}), "2.5").loads


def test_dict_subclass_items_refused_from_2_10() -> None:
    dd = _facts(collections.defaultdict(list, {"a": [1]}))
    old, new = predict(dd, "2.9"), predict(dd, "2.10")
    assert old.needs == ("builtins.list", "collections.defaultdict") and old.reason is None
    assert not new.loads and new.reason and "SETITEM" in new.reason


def test_torchscript_refused_from_2_6() -> None:
    assert predict([], "2.5", container="torchscript").loads  # handed to torch.jit.load: CVE-2025-32434
    assert not predict([], "2.6", container="torchscript").loads


def test_blocked_module_is_never_fixable() -> None:
    verdict = predict(_facts(_Reduce(os.system, ("true",))), "2.13")
    assert not verdict.loads and verdict.reason and "blocks" in verdict.reason


def test_protocol_4_opcodes_refused() -> None:
    import pickle

    verdict = predict(facts_from_pickle(pickle.dumps({"a": 1}, protocol=4)), "2.13")
    assert not verdict.loads and verdict.reason and "FRAME" in verdict.reason


def test_default_version_reads_metadata() -> None:
    assert isinstance(predict(_facts({"a": 1})), WeightsOnlyVerdict)
    assert torch_version_default()


class _Reduce:
    def __init__(self, func: object, args: tuple) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return self.func, self.args
