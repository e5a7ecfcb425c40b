"""DTensor and ShardedTensor pickles: recognised structures, honest verdicts (issue 24).

A rank's torch.save of DTensors (verl, FSDP2) or ShardedTensors (FSDP1
SHARDED_STATE_DICT) is read by the restricted unpickler as records of the
two rebuild calls torch pickles them with, ``_rebuild_from_type_v2(
_rebuild_wrapper_subclass, T, args, state)`` and protocol 2's
``getattr(ShardedTensor, "ProcessGroupState")``. Nothing else changes: the
scan still calls out what torch.load(weights_only=False) would run, and the
weights_only prediction still says torch.load(weights_only=True) refuses.
Files: fixtures/ranks/ (fixtures/ranks/generate.py, 2 gloo processes).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")

from ckpt_tool import scan  # noqa: E402
from ckpt_tool.formats import ReadOptions  # noqa: E402
from ckpt_tool.formats.torchsave.archive import read_torch_zip  # noqa: E402
from ckpt_tool.pickles.unpickle.placeholders import LazyTensor, Placeholder  # noqa: E402
from ckpt_tool.pickles.unpickle.unpickler import restricted_loads  # noqa: E402

RANKS = ROOT / "fixtures" / "ranks"
DTENSOR_FILE = RANKS / "fsdp2_tp" / "a.pt"  # rank 1
FSDP1_FILE = RANKS / "fsdp1" / "fsdp1_rank1.pt"


def test_a_dtensor_is_read_as_its_class_with_the_wrapper_arguments_and_state():
    root = read_torch_zip(str(DTENSOR_FILE), ReadOptions()).root
    w = root["tp.weight"]
    assert isinstance(w, Placeholder) and w.qualname == "torch.distributed.tensor.DTensor"
    assert w.args[0].name == "float32" and w.args[1:3] == ((5, 7), (7, 1))  # global size and stride
    local, spec = w.attributes["_local_tensor"], w.attributes["_spec"]
    assert isinstance(local, LazyTensor) and local.shape == (5, 3)  # rank 1's 3 of 7 columns
    placement = spec.attributes["placements"][0]
    assert placement.qualname.endswith("placement_types.Shard") and placement.attributes["dim"] == 1
    assert spec.attributes["mesh"].attributes["_rank"] == 1


def test_a_sharded_tensor_reads_through_getattr_of_its_nested_class():
    root = read_torch_zip(str(FSDP1_FILE), ReadOptions()).root
    shards, _meta, pg, _spec, rrefs = root["odd.weight"].state
    assert pg.qualname == "torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState"
    assert pg.attributes["global_rank"] == 1 and rrefs is False
    assert shards[0].attributes["metadata"].attributes["shard_offsets"] == [4, 0]


def test_dtensor_files_scan_safe_and_weights_only_still_refuses(run_cli):
    report = scan([str(DTENSOR_FILE)])
    assert report.files[0].verdict == "safe"
    doc = json.loads(run_cli("inspect", "--json", str(DTENSOR_FILE)).out)
    assert doc["weights_only"]["loads"] is False
    assert "torch.distributed.tensor.DTensor" in doc["weights_only"]["needs"]


_LOAD = ("import sys, torch\n{imp}\ntry:\n    torch.load(sys.argv[1], weights_only=True)\n    print('loads')\n"
         "except Exception as exc:\n    print(type(exc).__name__, exc)\n")


def _fresh_torch_load(path, imp: str = "") -> str:
    """What torch.load(path, weights_only=True) does in a fresh interpreter (this one has imported DTensor)."""
    r = subprocess.run([sys.executable, "-c", _LOAD.format(imp=imp), str(path)], capture_output=True, text=True,
                       timeout=300, check=False)
    return r.stdout.strip()


@pytest.mark.parametrize("path", [DTENSOR_FILE, FSDP1_FILE])
def test_a_fresh_torch_refuses_them_under_weights_only(path):
    assert _fresh_torch_load(path).startswith("UnpicklingError Weights only load failed")


def test_importing_torch_distributed_tensor_allowlists_dtensors():
    # torch/distributed/tensor/__init__.py add_safe_globals DTensor's classes (device_mesh.py its layouts):
    # a program that imported it (any FSDP2 trainer) loads a DTensor file with weights_only=True.
    # ckpt's prediction is for torch.load in a process that has not: it says refuses (the line above).
    assert _fresh_torch_load(DTENSOR_FILE, "import torch.distributed.tensor") == "loads"
    assert _fresh_torch_load(FSDP1_FILE, "import torch.distributed.tensor").startswith("UnpicklingError")


def test_sharded_tensor_files_are_judged_by_the_catalog():
    """issue 32: torch.save's ShardedTensor (init_rrefs False) and getattr(ShardedTensor, "ProcessGroupState")
    are judged as what they are (tests/pickles/test_sharded_tensor_verdicts.py has the dangerous variants)."""
    f = scan([str(FSDP1_FILE)]).files[0]
    assert f.verdict == "safe", (f.globals, f.findings)
    judged = {f"{g.module}.{g.name}": g.severity for g in f.globals}
    assert judged["__builtin__.getattr"] == judged["torch.distributed._shard.sharded_tensor.api.ShardedTensor"] == \
        "safe"


@pytest.mark.parametrize("attr", ["lower", "_Inner", "Inner.Deeper"])
def test_any_other_getattr_stays_a_record_of_the_call(attr):
    data = b"\x80\x02c__builtin__\ngetattr\ncmylab\nOuter\nX" + len(attr).to_bytes(4, "little") + attr.encode() \
        + b"\x86R."
    obj = restricted_loads(data, where="t", path="t").obj
    assert isinstance(obj, Placeholder) and obj.qualname == "__builtin__.getattr" and obj.args[1] == attr


def test_getattr_of_a_nested_class_is_a_placeholder_class():
    data = b"\x80\x02c__builtin__\ngetattr\ncmylab\nOuter\nX\x05\x00\x00\x00Inner\x86R)\x81."
    result = restricted_loads(data, where="t", path="t")
    assert result.obj.qualname == "mylab.Outer.Inner"
    assert {(r.qualname, r.severity) for r in result.references} >= {("__builtin__.getattr", "dangerous")}


def test_a_wrapper_rebuild_of_another_class_is_not_recognised(tmp_path):
    # what torch pickles for a wrapper subclass (DTensor's shape), naming a class that is not DTensor
    data = (b"\x80\x02ctorch._tensor\n_rebuild_from_type_v2\n(ctorch._utils\n_rebuild_wrapper_subclass\n"
            b"cmylab\nSub\n(cmylab\nSub\nctorch\nfloat32\nK\x02\x85K\x01\x85K\x00X\x0d\x00\x00\x00torch.strided"
            b"X\x03\x00\x00\x00cpu\x89tNtR.")
    obj = restricted_loads(data, where="t", path="t").obj
    # not a DTensor: a tensor subclass record (issue 32), its class kept as a placeholder, never imported
    assert type(obj).__name__ == "SubclassTensor" and obj.qualname == "mylab.Sub" and obj.shape == (2,)
    path = tmp_path / "sub.pkl"
    path.write_bytes(data)
    f = scan([str(path)]).files[0]
    assert f.verdict == "dangerous" and any(g.name == "Sub" and g.severity == "dangerous" for g in f.globals)
