"""Quantized tensors (torch._utils._rebuild_qtensor): read as torch reads them, never half-written."""
from __future__ import annotations

import json
import warnings

import pytest
import torch


@pytest.fixture
def qfile(tmp_path):
    warnings.simplefilter("ignore")
    q = torch.quantize_per_tensor(torch.randn(4, 3), 0.1, 3, torch.qint8)
    q4 = torch.quantize_per_tensor(torch.rand(8), 0.1, 0, torch.quint4x2)
    qc = torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.quint8)
    q32 = torch.quantize_per_tensor(torch.randn(5), 0.5, 0, torch.qint32)
    path = tmp_path / "q.pth"
    torch.save({"q": q, "q4": q4, "qc": qc, "q32": q32, "w": torch.ones(2)}, path)
    legacy = tmp_path / "q_legacy.pth"
    torch.save({"q": q}, legacy, _use_new_zipfile_serialization=False)
    return path, legacy


def test_inspect_lists_quantized_tensors_as_torch_loads_them(run_cli, qfile):
    path, legacy = qfile
    r = run_cli("inspect", str(path), "--json")
    assert r.code == 0, r
    rows = {t["key"]: t for t in json.loads(r.out)["tensors"]}
    loaded = torch.load(path, weights_only=True)
    for key, t in loaded.items():
        assert rows[key]["dtype"] == str(t.dtype).removeprefix("torch."), key
        assert rows[key]["shape"] == list(t.shape)
    assert rows["q4"]["nbytes"] == 4  # two 4-bit values per byte
    r = run_cli("inspect", str(legacy), "--json")
    assert r.code == 0 and json.loads(r.out)["tensors"][0]["dtype"] == "qint8"


def test_quantized_files_scan_safe_and_stats_skip_them(run_cli, qfile):
    path, _ = qfile
    assert run_cli("scan", str(path)).code == 0
    r = run_cli("inspect", str(path), "--stats")
    assert r.code == 0, r


# Changed deliberately in issue 21: migrate used to refuse quantized tensors (exit 2) for every output;
# a .pth output now writes them back with their quantizer, formats that cannot hold them still refuse.
def test_migrate_writes_quantized_tensors_back_exactly_to_pth(run_cli, qfile, tmp_path):
    path, legacy = qfile
    for src in (path, legacy):
        out = tmp_path / f"out_{src.stem}.pth"
        r = run_cli("migrate", str(src), "-o", str(out))
        assert r.code == 0, r
        assert "quantized tensor(s) with their scales and zero points" in r.out
        before, after = torch.load(src, weights_only=True), torch.load(out, weights_only=True)
        assert list(before) == list(after)
        for key, a in before.items():
            b = after[key]
            assert b.dtype == a.dtype and b.shape == a.shape, key
            if not a.is_quantized:
                assert torch.equal(a, b)
                continue
            assert b.qscheme() == a.qscheme(), key
            assert torch.equal(b.int_repr(), a.int_repr()), key
            if a.qscheme() == torch.per_tensor_affine:
                assert (b.q_scale(), b.q_zero_point()) == (a.q_scale(), a.q_zero_point()), key
            else:
                assert torch.equal(b.q_per_channel_scales(), a.q_per_channel_scales())
                assert torch.equal(b.q_per_channel_zero_points(), a.q_per_channel_zero_points())
                assert b.q_per_channel_axis() == a.q_per_channel_axis()
            assert torch.equal(b.dequantize(), a.dequantize()), key


@pytest.mark.parametrize("out_name", ["out.safetensors", "shards/", "dcp_out"])
def test_formats_that_cannot_hold_quantized_tensors_refuse_naming_them(run_cli, qfile, tmp_path, out_name):
    path, _ = qfile
    out = tmp_path / out_name
    extra = ["--max-shard-size", "1KB"] if out_name.endswith("/") else ["--to", "dcp"] if out_name == "dcp_out" else []
    r = run_cli("migrate", str(path), "-o", str(out), *extra)
    assert r.code == 2, r
    assert r.err.count("\n") == 1 and "cannot hold quantized tensors" in r.err
    assert "'q'" in r.err and "'qc'" in r.err and "'q32'" in r.err
    assert not out.exists()
    r = run_cli("migrate", str(path), "-o", str(out), *extra, "--drop", "q*")
    assert r.code == 0, r


def test_verification_compares_the_quantizer(qfile, tmp_path):
    """A re-read output whose scale differs from the source fails verification (the bytes alone are equal)."""
    from ckpt_tool import migrate

    path, _ = qfile
    out = tmp_path / "out.pth"

    def change_scale(tmp: str) -> None:
        sd = torch.load(tmp, weights_only=True)
        q = sd["q"]
        sd["q"] = torch._make_per_tensor_quantized_tensor(q.int_repr(), q.q_scale() * 2, q.q_zero_point())
        torch.save(sd, tmp)

    report = migrate(path, out, _after_write=change_scale)
    assert not report.ok and not out.exists()
    assert any("q: quantizer scale is 0.2" in f for f in report.failures), report.failures


MODELS = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2, bias=False)
        self.norm = nn.LayerNorm(3)

    def forward(self, x):
        return self.fc2(self.norm(self.fc(x)))


def dynamic(seed=0):
    torch.manual_seed(seed)
    return torch.ao.quantization.quantize_dynamic(Net(), {nn.Linear}, dtype=torch.qint8)
"""


@pytest.fixture
def dynamic(tmp_path):
    """A quantize_dynamic state_dict (packed qint8 weights) and the factory file that builds the model."""
    path, models, mod, model = _saved_dynamic(tmp_path, MODELS, "qmodels", "dynamic.pth")
    return path, models, mod, model


def _saved_dynamic(tmp_path, source: str, name: str, saved: str):
    """Write the factory file ``source``, import it, build ``dynamic(0)`` and torch.save its state_dict."""
    import importlib.util

    warnings.simplefilter("ignore")
    models = tmp_path / f"{name}.py"
    models.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_test", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.dynamic(0)
    path = tmp_path / saved
    torch.save(model.state_dict(), path)
    return path, models, mod, model


def test_inspect_lists_every_tensor_inside_packed_params(run_cli, dynamic):
    path, _, _, model = dynamic
    r = run_cli("inspect", str(path), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    rows = {t["key"]: t for t in doc["tensors"]}
    w = rows["fc._packed_params._packed_params.0"]
    assert w["dtype"] == "qint8" and w["shape"] == [3, 4]
    assert any("scale=" in n and "zero_point=0" in n for n in w["notes"])
    assert rows["fc._packed_params._packed_params.1"]["dtype"] == "float32"
    assert rows["fc._packed_params._packed_params.1"]["shape"] == [3]
    assert rows["fc2._packed_params._packed_params.0"]["shape"] == [2, 3]
    assert "fc2._packed_params._packed_params.1" not in rows  # saved as None: no tensor
    # every tensor of the state_dict, the packed ones included
    expected = sum(1 for v in model.state_dict().values() if isinstance(v, torch.Tensor)) + 3
    assert len(rows) == expected == 9
    assert doc["total_numel"] == 1 + 1 + 12 + 3 + 1 + 1 + 6 + 3 + 3
    assert "fc._packed_params._packed_params" not in doc["metadata_keys"]


@pytest.mark.parametrize("with_target", [False, True])
def test_dynamic_quantized_migrates_to_pth_and_loads_into_the_quantized_model(run_cli, dynamic, tmp_path,
                                                                              with_target):
    path, models, mod, model = dynamic
    out = tmp_path / "out.pth"
    extra = ["--target", f"{models}:dynamic"] if with_target else []
    r = run_cli("migrate", str(path), "-o", str(out), *extra)
    assert r.code == 0, r
    assert "bug in ckpt" not in r.err
    if with_target:
        assert "load_state_dict into the target (strict=True)" in r.out
    fresh = mod.dynamic(seed=5)  # other weights, same architecture
    result = fresh.load_state_dict(torch.load(out, weights_only=True), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(6, 4)
    assert torch.equal(fresh(x), model(x))
    a, b = model.fc._packed_params._weight_bias(), fresh.fc._packed_params._weight_bias()
    assert torch.equal(a[0].int_repr(), b[0].int_repr()) and a[0].q_scale() == b[0].q_scale()
    assert torch.equal(a[1], b[1])


def test_dynamic_quantized_keeps_packed_params_together_under_rules(run_cli, dynamic, tmp_path):
    path, _, _, model = dynamic
    out = tmp_path / "prefixed.pth"
    r = run_cli("migrate", str(path), "-o", str(out), "--add-prefix", "net.", "--dtype", "bf16")
    assert r.code == 0, r
    assert "keep their dtype" in r.out  # the packed bias stays float32
    sd = torch.load(out, weights_only=True)
    w, b = sd["net.fc._packed_params._packed_params"]
    assert w.dtype == torch.qint8 and b.dtype == torch.float32
    assert torch.equal(w.int_repr(), model.fc._packed_params._weight_bias()[0].int_repr())
    assert sd["net.fc2._packed_params._packed_params"][1] is None
    assert sd["net.norm.weight"].dtype == torch.bfloat16
    r = run_cli("migrate", str(path), "-o", str(tmp_path / "half.pth"), "--drop", "fc._packed_params._packed_params.1")
    assert r.code == 2 and "load together" in r.err
    assert not (tmp_path / "half.pth").exists()


def test_dynamic_quantized_to_safetensors_refuses_instead_of_dropping(run_cli, dynamic, tmp_path):
    path, models, _, _ = dynamic
    out = tmp_path / "out.safetensors"
    r = run_cli("migrate", str(path), "-o", str(out))
    assert r.code == 2 and "cannot hold quantized tensors" in r.err
    assert "'fc._packed_params._packed_params.0'" in r.err and "'fc2._packed_params._packed_params.0'" in r.err
    assert not out.exists()
    r = run_cli("migrate", str(path), "-o", str(out), "--target", f"{models}:dynamic")
    assert r.code == 2 and "bug in ckpt" not in r.err


LSTM_MODELS = """
import torch
from torch import nn


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(self.lstm(x)[0])


def dynamic(seed=0):
    torch.manual_seed(seed)
    return torch.ao.quantization.quantize_dynamic(Seq(), {nn.LSTM, nn.Linear}, dtype=torch.qint8)
"""


def test_dynamic_quantized_lstm_round_trips_through_pth_and_is_never_dropped(run_cli, tmp_path):
    """The LSTM's packed weights are a torch.ScriptObject: written back as read, refused where they would be lost."""
    src, models, mod, model = _saved_dynamic(tmp_path, LSTM_MODELS, "lstm_models", "lstm.pth")
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out))
    assert r.code == 0, r
    fresh = mod.dynamic(3)
    fresh.load_state_dict(torch.load(out, weights_only=False), strict=True)  # a ScriptObject: not weights_only
    x = torch.randn(2, 1, 4)
    assert torch.equal(fresh(x), model(x))
    st = tmp_path / "out.safetensors"
    r = run_cli("migrate", str(src), "-o", str(st), "--drop", "fc._packed*")
    assert r.code == 2 and "'lstm._all_weight_values.0.param'" in r.err and "would be lost" in r.err
    assert not st.exists()
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "t.pth"), "--target", f"{models}:dynamic")
    assert r.code == 2 and "bug in ckpt" not in r.err and "torch.ScriptObject" in r.err
    assert not (tmp_path / "t.pth").exists()
