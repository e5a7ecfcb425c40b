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


def test_migrate_refuses_quantized_tensors_before_writing(run_cli, qfile, tmp_path):
    path, _ = qfile
    out = tmp_path / "out.pth"
    r = run_cli("migrate", str(path), "-o", str(out))
    assert r.code == 2 and "quantized tensors cannot be migrated" in r.err
    assert not out.exists()
