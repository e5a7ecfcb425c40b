"""Multi-rank DCP folders from every trainer, consolidated like torch's dcp_to_torch_save (issue 14).

fixtures/dcp_multi/ holds folders written by 2 gloo processes (FSDP2
model+optimizer, a hand-built model-only set with Shard/Replicate/plain
tensors, Accelerate's FSDP layout) with dcp_to_torch_save's own output
beside each (``D.expected.pt`` nested, ``D.expected.safetensors`` flat).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import ROOT

from tests.helpers.bits import bits

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402
from ckpt_tool.formats.dcp.stream import DcpStreamSource  # noqa: E402

MULTI = ROOT / "fixtures" / "dcp_multi"
FOLDERS = ["fsdp2", "model_only", "accelerate/pytorch_model_fsdp_0", "accelerate/optimizer_0"]


def assert_same_tree(a, b, path="") -> None:
    """Structure, non-tensor values and every tensor's bytes (dtype and shape too)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(bits(a), bits(b)), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for k in a:
            assert_same_tree(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{path}.{i}")
    else:
        assert a == b and type(a) is type(b), path


@pytest.mark.parametrize("folder", FOLDERS)
def test_pth_equals_dcp_to_torch_save_bit_for_bit(folder, tmp_path):
    out = tmp_path / "out.pth"
    report = migrate(MULTI / folder, out)
    assert report.ok and report.written
    want = torch.load(MULTI / f"{folder}.expected.pt", weights_only=True)
    assert_same_tree(want, torch.load(out, weights_only=True))


@pytest.mark.parametrize("folder,prefix", [("fsdp2", "model."), ("model_only", "model."),
                                           ("accelerate/pytorch_model_fsdp_0", "model."),
                                           ("accelerate/optimizer_0", "optimizer.state.")])
def test_safetensors_equal_the_flattened_expected(folder, prefix, tmp_path):
    out = tmp_path / "out.safetensors"
    report = migrate(MULTI / folder, out, add_prefix=prefix)
    assert report.ok
    want = st.load_file(str(MULTI / f"{folder}.expected.safetensors"))
    got = st.load_file(str(out))
    assert set(got) == {k for k in want if k.startswith(prefix)}
    for k, v in got.items():
        assert (v.dtype, v.shape) == (want[k].dtype, want[k].shape) and torch.equal(bits(v), bits(want[k])), k


def _spy(monkeypatch) -> list[str]:
    seen: list[str] = []
    for name in ("read", "read_into"):
        original = getattr(DcpStreamSource, name)

        def spy(self, key, *a, _original=original, **k):
            seen.append(key)
            return _original(self, key, *a, **k)

        monkeypatch.setattr(DcpStreamSource, name, spy)
    return seen


def test_key_model_takes_the_model_without_reading_the_optimizer(monkeypatch, tmp_path):
    seen = _spy(monkeypatch)
    report = migrate(MULTI / "fsdp2", tmp_path / "model.safetensors", key="model")
    assert report.ok
    assert seen and all(k.startswith("model.") for k in seen), sorted(set(seen))
    seen.clear()
    report = migrate(MULTI / "fsdp2", tmp_path / "model.pth", key="model", state_dict_only=True)
    assert report.ok and all(k.startswith("model.") for k in seen)
    got = torch.load(tmp_path / "model.pth", weights_only=True)
    want = torch.load(MULTI / "fsdp2.expected.pt", weights_only=True)["model"]
    assert_same_tree(want, dict(got))


def test_inspect_reads_no_chunk(monkeypatch, run_cli):
    seen = _spy(monkeypatch)
    for folder in FOLDERS:
        r = run_cli("inspect", str(MULTI / folder), "--json")
        assert r.code == 0, r
    assert not seen
    doc = json.loads(run_cli("inspect", str(MULTI / "model_only"), "--json").out)
    assert doc["tensor_count"] == 6 and doc["state_dict_key"] == "model"


def test_row_sharded_tensors_stream_without_assembling(monkeypatch, tmp_path):
    def refuse(self, key):
        raise AssertionError(f"{key} was assembled in memory")

    monkeypatch.setattr(DcpStreamSource, "_assembled", refuse)
    report = migrate(MULTI / "fsdp2", tmp_path / "out.safetensors", key="model")
    assert report.ok


def test_column_sharded_tensor_is_assembled_like_torch(tmp_path):
    """A Shard(1) (tensor-parallel) split goes through the bounded in-memory path and still matches."""
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    full = torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6)
    folder = tmp_path / "tp"
    folder.mkdir()
    storage = {}
    chunks = []
    for rank, (lo, hi) in enumerate(((0, 4), (4, 6))):
        name = f"__{rank}_0.distcp"
        with open(folder / name, "wb") as f:
            torch.save(full[:, lo:hi].clone(), f)
            length = f.tell()
        storage[MetadataIndex("model.w", torch.Size((0, lo)))] = _StorageInfo(name, 0, length)
        chunks.append(ChunkStorageMetadata(torch.Size((0, lo)), torch.Size((5, hi - lo))))
    sdm = {"model.w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), full.size(), chunks)}
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage,
                             planner_data={"model.w": ("model", "w")}), f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(folder), str(tmp_path / "torch.pt"))
    report = migrate(folder, tmp_path / "ckpt.pth")
    assert report.ok
    assert_same_tree(torch.load(tmp_path / "torch.pt", weights_only=True),
                     torch.load(tmp_path / "ckpt.pth", weights_only=True))


def test_non_tensor_entries_are_described_by_load_and_read_as_values_on_request():
    """A metadata answer leaves the bytes items in their shard files; migrate and diff --values read them."""
    from ckpt_tool.model import Deferred

    ck = load(MULTI / "fsdp2")
    groups = ck.metadata["optim"]["param_groups"]
    assert isinstance(groups, list) and isinstance(groups[0]["lr"], Deferred)
    assert str(groups[0]["lr"]) == "<bytes item: 1261 bytes in __1_0.distcp, not read>"
    ck = load(MULTI / "fsdp2", read_values=True)
    groups = ck.metadata["optim"]["param_groups"]
    assert isinstance(groups, list) and groups[0]["lr"] == 0.01 and groups[0]["betas"] == [0.9, 0.999]
    assert ck.root["optim"]["param_groups"][0]["lr"] == 0.01
    assert Path(ck.path).name == "fsdp2"


def test_metadata_paths_open_no_shard_file(monkeypatch, run_cli):
    """inspect and diff (without --values) read .metadata alone: no .distcp file is opened."""
    from ckpt_tool.io import paths

    opened: list[str] = []
    original = paths.open_bytes

    def spy(path):
        opened.append(str(path))
        return original(path)

    monkeypatch.setattr(paths, "open_bytes", spy)
    for folder in FOLDERS:
        r = run_cli("inspect", "--json", str(MULTI / folder))
        assert r.code == 0, r
        doc = json.loads(r.out)
        assert all(x["kind"] == "bytes item" and x["nbytes"] > 0 for x in doc["metadata_not_read"])
    r = run_cli("diff", "--json", str(MULTI / "fsdp2"), str(MULTI / "fsdp2"))
    assert r.code == 0, r
    assert json.loads(r.out)["equal"]
    assert not [p for p in opened if p.endswith(".distcp")], opened
    assert json.loads(run_cli("inspect", "--json", str(MULTI / "fsdp2")).out)["metadata_not_read"][0] == {
        "key": "optim.param_groups.0.lr", "kind": "bytes item", "nbytes": 1261, "file": "__1_0.distcp"}


def test_diff_values_reads_and_compares_the_non_tensor_entries(tmp_path, run_cli):
    import shutil

    other = tmp_path / "fsdp2"
    shutil.copytree(MULTI / "fsdp2", other)
    ck = load(other, read_values=True)
    lr = ck.root["optim"]["param_groups"][0]["lr"]
    assert lr == 0.01
    # the same checkpoint with another learning rate: the pickled 0.01 replaced by 0.02 in place
    data = (other / "__1_0.distcp").read_bytes()
    import struct

    old, new = struct.pack(">d", 0.01), struct.pack(">d", 0.02)
    assert data.count(old) >= 1
    (other / "__1_0.distcp").write_bytes(data.replace(old, new, 1))
    plain = json.loads(run_cli("diff", "--json", str(MULTI / "fsdp2"), str(other)).out)
    assert plain["metadata_diff"]["changed"] == []
    assert any("not compared" in w for w in plain["warnings"])
    r = run_cli("diff", "--json", "--values", str(MULTI / "fsdp2"), str(other))
    changed = json.loads(r.out)["metadata_diff"]["changed"]
    assert [(c["path"], c["a"], c["b"]) for c in changed] == [("optim.param_groups.0.lr", 0.01, 0.02)]
