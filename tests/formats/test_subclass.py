"""Tensor subclasses (torchao's quantized tensors): listed with their inner data, written back to .pth
exactly, and refused (exit 2, naming the keys) wherever they cannot be kept."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torchao", reason="torchao (test-only, requirements-test.txt) is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "torchao_files.py")
SCHEMES = ["int8_weight_only", "int8_dynamic", "float8_weight_only", "intx_weight_only"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, SCRIPT, *args], check=False, capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchao")
    r = _run(str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    with open(out / "expected.json") as f:
        return out, json.load(f)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_inspect_lists_subclasses_as_tensors_with_their_inner_data(run_cli, files, scheme):
    folder, expected = files
    r = run_cli("inspect", str(folder / f"{scheme}.pth"), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    rows = {t["key"]: t for t in doc["tensors"]}
    assert sorted(rows) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert doc["metadata_keys"] == []
    for key, want in expected[scheme].items():
        row = rows[key]
        assert (row["dtype"], row["shape"]) == (want["dtype"], want["shape"])
        sub = row["subclass"]
        assert sub["class"] == want["class"]  # the module the pickle names (torchao sets __module__)
        got = {i["name"]: [i["dtype"], i["shape"]] for i in sub["inner"]}
        assert got == want["inner"], key
        assert row["nbytes"] == sum(i["nbytes"] for i in sub["inner"])
    text = run_cli("inspect", str(folder / f"{scheme}.pth"))
    assert text.code == 0 and "subclass torchao.quantization." in text.out and "qdata" in text.out


@pytest.mark.parametrize("scheme", [*SCHEMES, "int8_weight_only_legacy"])
def test_pth_round_trip_loads_with_torchao_bit_for_bit(run_cli, files, tmp_path, scheme):
    folder, _ = files
    src, out = folder / f"{scheme}.pth", tmp_path / "out.pth"
    r = run_cli("migrate", str(src), "-o", str(out))
    assert r.code == 0, r
    assert "verified" in r.out and "4 kept source tensors" in r.out
    assert "2 tensor subclass(es) (torchao.quantization." in r.out and "their inner tensors compared" in r.out
    loaded = _run("check", str(src), str(out))
    assert loaded.returncode == 0 and "same" in loaded.stdout, loaded.stdout + loaded.stderr[-2000:]


@pytest.mark.parametrize("scheme", ["int8_weight_only", "float8_weight_only"])
def test_outputs_that_cannot_hold_a_subclass_refuse_naming_keys(run_cli, files, tmp_path, scheme):
    src = str(files[0] / f"{scheme}.pth")
    for args in (["-o", str(tmp_path / "o.safetensors")], ["--to", "dcp", "-o", str(tmp_path / "dcp")],
                 ["-o", str(tmp_path / "o.pth"), "--dtype", "bf16"], ["-o", str(tmp_path / "o.pth"), "--sanitize"],
                 ["--to", "hf", "-o", str(tmp_path / "hf")]):
        r = run_cli("migrate", src, *args)
        assert r.code == 2, (args, r)
        assert "'0.weight'" in r.err and "'2.weight'" in r.err and "--drop" in r.err, r.err
        assert not os.listdir(tmp_path), args  # nothing written
    r = run_cli("migrate", src, "-o", str(tmp_path / "o.safetensors"), "--drop", "*.weight")
    assert r.code == 0, r
    assert "2 dropped by your rules" in r.out


def test_diff_compares_subclasses_by_their_inner_tensors(run_cli, files, tmp_path):
    src, out = files[0] / "int8_weight_only.pth", tmp_path / "copy.pth"
    assert run_cli("migrate", str(src), "-o", str(out)).code == 0
    r = run_cli("diff", str(src), str(out), "--values", "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["values_total"] == 8  # two biases, and qdata, scale, zero_point of each weight
    assert {v["key"] for v in doc["values"]} >= {"0.weight.qdata", "0.weight.scale", "2.weight.zero_point"}
    assert not any("hold no data" in w for w in doc["warnings"])


def test_diff_says_when_a_subclass_meets_a_plain_tensor(run_cli, files, tmp_path):
    import torch

    plain = tmp_path / "float.pth"
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    torch.save(model.state_dict(), plain)
    r = run_cli("diff", str(plain), str(files[0] / "int8_weight_only.pth"))
    assert "hold another kind of data on each side" in r.out + r.err and "torchao.quantization.Int8Tensor" in r.out


def test_verification_compares_the_inner_tensors(files, tmp_path):
    """An output whose qdata differs by one byte from the source fails verification and is not published."""
    import zipfile

    from ckpt_tool import migrate

    src, out = files[0] / "int8_weight_only.pth", tmp_path / "out.pth"

    def flip_qdata(tmp: str) -> None:
        with zipfile.ZipFile(tmp) as z:
            members = [(i, z.read(i)) for i in z.infolist()]
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
            for info, data in members:
                qdata = info.filename.split("/")[-2:-1] == ["data"] and len(data) == 16 * 32  # 0.weight's int8 qdata
                z.writestr(info, bytes([data[0] ^ 1]) + data[1:] if qdata else data)

    report = migrate(src, out, _after_write=flip_qdata)
    assert not report.ok and not out.exists()
    assert any("0.weight" in f and "qdata" in f and "bytes differ" in f for f in report.failures), report.failures


@pytest.mark.parametrize("scheme", SCHEMES)
def test_torchao_files_scan_safe(run_cli, files, scheme):
    """torch.load(weights_only=False) of these files imports torchao's classes and stores data: the catalog
    reviewed them (third_party.py, torchao 0.18.0)."""
    r = run_cli("scan", str(files[0] / f"{scheme}.pth"))
    assert r.code == 0, r


def test_gate_reads_the_inner_tensors_for_nan(run_cli, files):
    r = run_cli("gate", str(files[0] / "int8_weight_only.pth"))
    assert "no-nan-inf" in r.out and "4 floating tensors, all finite" in r.out, r  # 2 biases and 2 scales
    r = run_cli("gate", str(files[0] / "int8_nan_scale.pth"))
    assert r.code == 1 and "0.weight.scale (1 NaN)" in r.out, r


def test_a_wrapper_saved_on_a_gpu_is_written_on_the_cpu_with_its_data(run_cli, files, tmp_path):
    """Its inner tensors are written as CPU tensors (as every tensor migrate writes), so the wrapper is too: the
    output loads without map_location and equals the source loaded on the CPU."""
    src, out = files[0] / "int8_cuda_device.pth", tmp_path / "out.pth"
    doc = json.loads(run_cli("inspect", str(src), "--json").out)
    assert {t["key"]: t["device"] for t in doc["tensors"]}["0.weight"] == "cuda:0"
    r = run_cli("migrate", str(src), "-o", str(out))
    assert r.code == 0, r
    loaded = _run("check", str(src), str(out))
    assert loaded.returncode == 0 and "same" in loaded.stdout, loaded.stdout + loaded.stderr[-2000:]
    doc = json.loads(run_cli("inspect", str(out), "--json").out)
    assert {t["key"]: t["device"] for t in doc["tensors"]}["0.weight"] == "cpu"
