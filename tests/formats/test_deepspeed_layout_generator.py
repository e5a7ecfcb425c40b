"""The synthetic ZeRO-3 writer (benchmarks/generate_training.py) against real DeepSpeed files.

fixtures/deepspeed/ holds run folders written by DeepSpeed 0.19.8; these
tests need torch but not DeepSpeed: its three pickled classes are read as
stand-ins. They also check that the consolidation algorithm described in
fixtures/deepspeed/LAYOUT.md reproduces DeepSpeed's own output bit for bit.
"""
from __future__ import annotations

import math
import os
import pickle
import sys
import types
import zipfile
from collections import OrderedDict
from typing import Any

import pytest

from tests.helpers.bits import raw_bytes

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "fixtures", "deepspeed")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import generate_training as gt  # noqa: E402 - benchmarks/ is put on sys.path just above

RUNS = [f"zero{s}_{d}" for s in (1, 2, 3) for d in ("fp32", "bf16")]


class _Stub:
    """Any deepspeed.* global: keeps its constructor args and BUILD state."""

    ds_name = ""

    def __init__(self, *args: Any) -> None:
        self.args = args


_stubs: dict[str, type] = {}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] == "deepspeed":
            key = f"{module}.{name}"
            return _stubs.setdefault(key, type(name, (_Stub,), {"ds_name": key}))
        return super().find_class(module, name)


_pickle_module = types.SimpleNamespace(Unpickler=_Unpickler, load=pickle.load, __name__="pickle")


def load(path: str) -> Any:
    """torch.load without DeepSpeed installed (trusted committed fixtures)."""
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_pickle_module)


def signature(v: Any) -> Any:
    """Structure without values: types, keys, tensor dtypes/shapes/attributes."""
    if isinstance(v, torch.Tensor):
        return ("Tensor", str(v.dtype), tuple(v.shape), tuple(sorted(getattr(v, "__dict__", {}))), v.requires_grad)
    if isinstance(v, torch.Size):
        return ("Size", len(v))
    if isinstance(v, _Stub):
        return ("global", v.ds_name, len(getattr(v, "args", ())), tuple(sorted(k for k in vars(v) if k != "args")))
    if isinstance(v, dict):
        return (type(v).__name__, {k: signature(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [signature(x) for x in v])
    return type(v).__name__


def pickle_globals(path: str) -> set[str]:
    import pickletools

    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


def tiny_spec(bf16: bool) -> gt.Zero3Spec:
    """TinyTied's layout, read from the real ZeRO-3 model states."""
    real = load(os.path.join(FIXTURES, f"zero3_{'bf16' if bf16 else 'fp32'}", "global_step1",
                             "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    return gt.Zero3Spec(
        groups=[[(n, tuple(s)) for n, s in g.items()] for g in real["param_shapes"]],
        world_size=real["dp_world_size"],
        frozen=[(n, tuple(s)) for n, s in real["frozen_param_shapes"].items()],
        buffers={n: real["module"][n] for n in real["buffer_names"]},
        shared=dict(real["shared_params"]),
        bf16=bf16,
        config=real["ds_config"],
    )


def unordered(sig: Any) -> Any:
    """`module` key order follows module registration in DeepSpeed; compare it as a set."""
    kind, items = sig
    return kind, dict(sorted(items.items()))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_synthetic_zero3_matches_deepspeed_structure(tmp_path: Any, bf16: bool) -> None:
    spec = tiny_spec(bf16)
    folder = gt.write_zero3(str(tmp_path), spec)
    real_dir = os.path.join(FIXTURES, f"zero3_{'bf16' if bf16 else 'fp32'}", "global_step1")
    assert sorted(os.listdir(folder)) == sorted(os.listdir(real_dir))
    with open(os.path.join(tmp_path, "latest")) as f:
        assert f.read() == "global_step1"
    for name in sorted(os.listdir(real_dir)):
        real, synth = load(os.path.join(real_dir, name)), load(os.path.join(folder, name))
        if "model_states" in name:
            assert unordered(signature(synth.pop("module"))) == unordered(signature(real.pop("module"))), name
        assert signature(synth) == signature(real), name
        assert pickle_globals(os.path.join(folder, name)) == pickle_globals(os.path.join(real_dir, name)), name
        if "optim_states" in name:
            sizes = [t.numel() for t in real["optimizer_state_dict"]["fp32_flat_groups"]]
            assert [t.numel() for t in synth["optimizer_state_dict"]["fp32_flat_groups"]] == sizes


def consolidate(run: str) -> OrderedDict[str, Any]:
    """The algorithm of LAYOUT.md ("How DeepSpeed consolidates"), step by step."""
    with open(os.path.join(run, "latest")) as f:
        tag = f.read().strip()
    folder = os.path.join(run, tag)
    names = sorted(os.listdir(folder))
    models = [load(os.path.join(folder, n)) for n in names if n.endswith("_model_states.pt")]
    optims = [load(os.path.join(folder, n))["optimizer_state_dict"] for n in names if n.endswith("_optim_states.pt")]
    stage = optims[0]["zero_stage"].args[0]
    count = optims[0]["partition_count"]
    world = max(count) if isinstance(count, list) else count
    assert len(optims) == world
    m0 = models[0]
    out: OrderedDict[str, Any] = OrderedDict()
    for name in m0["buffer_names"]:
        v = m0["module"][name]
        out[name] = v.float() if v.is_floating_point() else v
    for name, shape in (m0["frozen_param_shapes"] or {}).items():
        if stage <= 2:
            out[name] = m0["frozen_param_fragments"][name]
        else:
            frags = [m["frozen_param_fragments"][name] for m in models]
            out[name] = torch.cat(frags)[: shape.numel()].view(shape)
    if stage <= 2:
        for g, shapes in enumerate(m0["param_shapes"]):
            flat = torch.cat([o["single_partition_of_fp32_groups"][g] for o in optims])
            pads = optims[0].get("param_alignment_paddings")
            offset = 0
            for i, (name, shape) in enumerate(shapes.items()):
                out[name] = flat[offset: offset + shape.numel()].view(shape)
                offset += shape.numel() + (pads[g][i] if pads else 0)
            align = 2 * world
            assert align * math.ceil(offset / align) == align * math.ceil(flat.numel() / align)
    else:
        flats = [torch.cat(list(o["fp32_flat_groups"])) for o in optims]
        offset = 0
        for shapes in m0["param_shapes"]:
            for name, shape in shapes.items():
                p = math.ceil(shape.numel() / world)
                out[name] = torch.cat([f[offset: offset + p] for f in flats])[: shape.numel()].view(shape)
                offset += p
        assert offset == flats[0].numel()
    for tied, source in m0["shared_params"].items():
        if source in out:
            out[tied] = out[source]
    return out


@pytest.mark.parametrize("run", RUNS)
def test_layout_algorithm_reproduces_deepspeed_consolidation(run: str) -> None:
    expected = safetensors_torch.load_file(os.path.join(FIXTURES, run, "expected.safetensors"))
    got = consolidate(os.path.join(FIXTURES, run))
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert raw_bytes(got[k]) == raw_bytes(v), k


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_synthetic_zero3_consolidates_to_expected(tmp_path: Any, world: int) -> None:
    spec = tiny_spec(bf16=False)
    spec = gt.Zero3Spec(groups=spec.groups, world_size=world, frozen=spec.frozen, buffers=spec.buffers,
                        shared=spec.shared, config=spec.config)
    gt.write_zero3(str(tmp_path), spec)
    got, expected = consolidate(str(tmp_path)), gt.expected_state_dict(spec)
    assert list(got) == list(expected)
    for k, v in expected.items():
        assert raw_bytes(got[k]) == raw_bytes(v), k
