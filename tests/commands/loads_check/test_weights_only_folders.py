"""weights_only for a folder says what torch.load does with it, file by file (issue 21).

``torch.load(folder)`` raises IsADirectoryError, so a folder never "loads";
the per-file verdicts are checked against what real torch does with each file.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"


def _real_torch_loads(path: Path) -> bool:
    """torch.load(weights_only=True) as in a fresh process: without the safe globals that libraries
    imported by other tests registered (megatron.core adds argparse.Namespace, for one)."""
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - any refusal counts: we compare verdicts, not messages
        return False
    finally:
        torch.serialization.add_safe_globals(registered)
    return True


def _wo(run_cli, path: Path) -> dict:
    r = run_cli("inspect", "--json", str(path))
    assert r.code == 0, r
    return json.loads(r.out)["weights_only"]


@pytest.mark.parametrize("folder", ["sharded", "sharded_bin", "dcp", "deepspeed/zero3_bf16", "deepspeed/zero1_fp32"])
def test_torch_load_cannot_open_a_folder_and_inspect_says_so(run_cli, folder):
    path = FIXTURES / folder
    with pytest.raises(IsADirectoryError):
        torch.load(path, weights_only=True)
    wo = _wo(run_cli, path)
    assert wo["loads"] is False and wo["applies"] is False and wo["torch"]  # the contract's keys, true values
    assert "IsADirectoryError" in wo["reason"] and isinstance(wo["needs"], list)
    assert wo["files"], wo
    text = run_cli("inspect", str(path)).out
    assert "torch.load cannot open it (it raises IsADirectoryError)" in text
    assert "loads it (torch" not in text.split("\n\n")[0]  # the old, false headline
    for f in wo["files"]:
        assert f"{f['path']}: read by {f['loader']}" in text


def test_safetensors_shards_are_read_by_safetensors(run_cli):
    wo = _wo(run_cli, FIXTURES / "sharded")
    assert [f["path"] for f in wo["files"]] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert {f["loader"] for f in wo["files"]} == {"safetensors"}
    for f in wo["files"]:  # torch 2.13 hands a *.safetensors path to safetensors: it loads
        assert f["loads"] is _real_torch_loads(FIXTURES / "sharded" / f["path"]) is True


def test_bin_shards_verdicts_match_real_torch(run_cli, tmp_path):
    wo = _wo(run_cli, FIXTURES / "sharded_bin" / "pytorch_model.bin.index.json")
    assert "UnpicklingError" in wo["reason"] and wo["loads"] is False
    with pytest.raises(Exception, match=r"load key|Unpickl"):  # an index is JSON: torch.load refuses it
        torch.load(FIXTURES / "sharded_bin" / "pytorch_model.bin.index.json", weights_only=True)
    # a shard that needs a global torch does not allow: that one file is refused, and named
    import argparse

    folder = tmp_path / "set"
    shutil.copytree(FIXTURES / "sharded_bin", folder)
    shard = folder / "pytorch_model-00002-of-00002.bin"
    sd = torch.load(shard, weights_only=True)
    sd["args"] = argparse.Namespace(lr=0.1)
    torch.save(sd, shard)
    wo = _wo(run_cli, folder)
    by = {f["path"]: f for f in wo["files"]}
    for name, f in by.items():
        assert f["loader"] == "torch.load"
        assert f["loads"] is _real_torch_loads(folder / name), name
    assert by[shard.name]["needs"] == ["argparse.Namespace"] and wo["needs"] == ["argparse.Namespace"]
    r = run_cli("gate", "--json", str(folder))
    check = next(c for c in json.loads(r.out)["files"][0]["checks"] if c["name"] == "weights-only")
    assert not check["passed"] and shard.name in check["detail"] and "argparse.Namespace" in check["detail"]
    r = run_cli("gate", "--json", "--allow-global", "argparse.Namespace", str(folder))
    check = next(c for c in json.loads(r.out)["files"][0]["checks"] if c["name"] == "weights-only")
    assert check["passed"], check


def test_dcp_files_name_their_loaders(run_cli):
    wo = _wo(run_cli, FIXTURES / "dcp")
    by = {f["path"]: f for f in wo["files"]}
    assert by[".metadata"]["loader"] == "pickle.load" and by[".metadata"]["loads"] is None
    assert "weights_only does not apply" in by[".metadata"]["reason"]
    assert by["__0_0.distcp"]["loader"] == "torch.distributed.checkpoint"
    assert "torch.distributed.checkpoint.load reads it" in wo["reason"]


@pytest.mark.parametrize("run", ["zero3_bf16", "zero1_fp32", "zero2_fp32"])
def test_deepspeed_rank_files_verdicts_match_real_torch(run_cli, run):
    folder = FIXTURES / "deepspeed" / run
    wo = _wo(run_cli, folder)
    assert len(wo["files"]) >= 2
    for f in wo["files"]:
        assert f["loader"] == "deepspeed"
        assert f["loads"] is _real_torch_loads(folder / f["path"]), f
        if not f["loads"]:
            assert f["needs"], f


def test_megatron_legacy_rank_files_verdicts_match_real_torch(run_cli):
    folder = FIXTURES / "deepspeed_parallel" / "megatron_legacy"
    r = run_cli("inspect", "--json", str(folder), "--tp-rules", str(folder / "rules.toml"))
    assert r.code == 0, r.err
    wo = json.loads(r.out)["weights_only"]
    assert [f["path"] for f in wo["files"]] == ["iter_0000001/mp_rank_00/model_optim_rng.pt",
                                                "iter_0000001/mp_rank_01/model_optim_rng.pt"]
    for f in wo["files"]:
        assert f["loader"] == "megatron-lm"
        assert f["loads"] is _real_torch_loads(folder / f["path"]) is False, f  # the saved args: a Namespace
        assert f["needs"] == ["argparse.Namespace"], f
