"""Every dtype torch 2.13 saves, through every command: inspect, scan, gate, diff and migrate.

The checkpoints are real torch.save files of tests/dtype_samples.py's tensors (one per dtype, quantized
per tensor and per channel included); the expectations come from torch itself, loaded in a subprocess.
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT, cli
from dtype_samples import QUANTIZED, all_samples, plain_names

ALL = [*plain_names(), *QUANTIZED, "qint8_per_channel"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(A, B): every dtype in one file each; B's element [0, 1] differs from A's in every tensor."""
    folder = tmp_path_factory.mktemp("dtypes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"; quantize_per_tensor is deprecated
        a, b = all_samples(), all_samples(changed=True)
    torch.save(a, folder / "a.pth")
    torch.save(b, folder / "b.pth")
    return folder / "a.pth", folder / "b.pth"


@pytest.fixture(scope="module")
def inspected(files):
    r = cli("inspect", "--json", str(files[0]))
    assert r.code == 0, r.err
    return {t["key"]: t for t in json.loads(r.out)["tensors"]}


@pytest.mark.parametrize("key", ALL)
def test_inspect_lists_every_dtype(inspected, key):
    dtype = "qint8" if key == "qint8_per_channel" else key
    t = inspected[key]
    assert t["dtype"] == dtype
    assert t["shape"] == ([2, 3] if key == "qint8_per_channel" else [2, 2])


def test_scan_calls_every_dtype_safe(files):
    r = cli("scan", "--json", str(files[0]))
    assert r.code == 0, r.err
    assert [f["verdict"] for f in json.loads(r.out)["files"]] == ["safe"]


def test_gate_passes_every_dtype_and_strict_names_the_unusual_ones(files):
    r = cli("gate", "--json", str(files[0]))
    assert r.code == 0, r.out
    checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
    assert checks["weights-only"]["passed"] and checks["loads-safely"]["passed"]
    strict = cli("gate", "--strict", str(files[0]))
    assert strict.code == 1
    assert "unusual dtypes" in strict.out and "float4_e2m1fn_x2" in strict.out


def test_torch_loads_what_ckpt_reads_bit_for_bit(files):
    """Differential: torch.load(weights_only=True) in a fresh process gives the bytes ckpt reads, per key."""
    from ckpt_tool import load
    from ckpt_tool.tensors.tensordata import tensor_bytes

    code = ("import sys, json, torch, warnings\nwarnings.simplefilter('ignore')\n"
            "sd = torch.load(sys.argv[1], weights_only=True)\n"
            "out = {}\n"
            "for k, t in sd.items():\n"
            "    raw = t.int_repr() if t.is_quantized else t\n"
            "    out[k] = [str(t.dtype).removeprefix('torch.'), list(t.shape),"
            " raw.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()]\n"
            "print(json.dumps(out))\n")
    p = subprocess.run([sys.executable, "-c", code, str(files[0])], capture_output=True, text=True, timeout=120,
                       check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    expected = json.loads(p.stdout)
    ckpt = load(str(files[0]))
    got = {t.key: [t.dtype, list(t.shape), tensor_bytes(t).hex()] for t in ckpt.tensors}
    assert sorted(got) == sorted(expected) == sorted(ALL)
    assert got == expected
