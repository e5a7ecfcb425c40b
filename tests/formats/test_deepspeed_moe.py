"""DeepSpeed MoE runs (issue 32): every expert file is read, judged and consolidated.

The fixtures (fixtures/deepspeed_moe/generate.py) are real runs of a model
holding two ``deepspeed.moe.layer.MoE`` layers of 4 experts, trained for one
step on 2 gloo ranks with expert parallelism 1 and 2 and ZeRO 0/1/2; each
``expected.safetensors`` is what DeepSpeed's own ``engine.load_checkpoint``
put into a fresh model on every rank (local experts renamed to their global
ids). Consolidation must be equal to it bit for bit, every expert included.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, cli

from ckpt_tool.commands.migrate import migrate
from tests.helpers.bits import raw_bytes

MOE = ROOT / "fixtures" / "deepspeed_moe"
RUNS = sorted(p.name for p in MOE.iterdir() if (p / "expected.safetensors").is_file()) if MOE.is_dir() else []


def _safetensors(path: Path) -> dict[str, bytes]:
    pytest.importorskip("torch")
    from safetensors.torch import load_file

    return {k: raw_bytes(v) for k, v in load_file(path).items()}


def test_the_fixtures_are_here():
    assert {"zero0_ep2", "zero1_ep1", "zero2_ep2", "zero2_ep2_bf16"} <= set(RUNS)


@pytest.mark.parametrize("run", RUNS)
def test_inspect_lists_every_expert_of_every_layer(run):
    info = json.loads((MOE / run / "expected.json").read_text())
    result = cli("inspect", str(MOE / run), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    keys = {t["key"]: (t["dtype"], t["shape"]) for t in doc["tensors"]}
    assert keys == {k: (v["dtype"], v["shape"]) for k, v in info["expected"].items()}
    for layer in ("moe1", "moe2"):
        ids = {int(k.split("deepspeed_experts.")[1].split(".")[0]) for k in keys if k.startswith(f"{layer}.")
               and "deepspeed_experts" in k}
        assert ids == set(range(info["num_experts"]))
    moe = doc["metadata"]["deepspeed"]["moe"]
    assert moe["num_experts"] == [4, 4] and moe["expert_files"] == 8
    assert not [w for w in doc["warnings"] if "danger" in w.lower()]
    assert "MoE 2 layer(s) x 4/4 experts (8 expert files)" in cli("inspect", str(MOE / run)).out
    if info.get("dtype") == "bf16":  # the module's dtype, as load_checkpoint restores it; the masters are not used
        assert any("fp32 master weights are not assembled" in w for w in doc["warnings"])


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("out,workers", [("m.safetensors", 1), ("m.safetensors", 2), ("m.pth", 1),
                                         ("shards", 2)])
def test_consolidation_equals_deepspeeds_load_checkpoint(tmp_path, run, out, workers):
    torch = pytest.importorskip("torch")
    extra = {"max_shard_size": "1KB"} if out == "shards" else {}
    report = migrate(MOE / run, tmp_path / out, workers=workers, **extra)
    assert report.ok and report.written and report.verified == {"cpu": True}, report.failures
    expected = _safetensors(MOE / run / "expected.safetensors")
    if out.endswith(".pth"):
        sd = torch.load(tmp_path / out, weights_only=True)
        got = {k: raw_bytes(v) for k, v in sd.items()}
    elif out == "shards":
        got = {}
        for shard in sorted((tmp_path / out).glob("*.safetensors")):
            got.update(_safetensors(shard))
    else:
        got = _safetensors(tmp_path / out)
    assert set(got) == set(expected)
    assert [k for k in expected if got[k] != expected[k]] == []


def _copy(run: str, tmp_path: Path) -> Path:
    dst = tmp_path / run
    shutil.copytree(MOE / run, dst)
    return dst / "global_step1"


def test_a_missing_expert_file_is_an_error_never_a_dropped_expert(tmp_path):
    tag = _copy("zero1_ep1", tmp_path)
    (tag / "layer_1_expert_2_mp_rank_00_model_states.pt").unlink()
    result = cli("inspect", str(tag.parent))
    assert result.code == 2
    assert "layer_1_expert_2_mp_rank_00_model_states.pt is missing" in result.err
    report = cli("migrate", str(tag.parent), "-o", str(tmp_path / "m.safetensors"))
    assert report.code == 2 and not (tmp_path / "m.safetensors").exists()


def test_an_expert_file_holding_another_experts_key_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    tag = _copy("zero2_ep2", tmp_path)
    path = tag / "layer_1_expert_3_mp_rank_00_model_states.pt"
    sd = torch.load(path, weights_only=True)
    torch.save({k.replace("deepspeed_experts.3.", "deepspeed_experts.1."): v for k, v in sd.items()}, path)
    result = cli("inspect", str(tag.parent))
    assert result.code == 2
    assert "names expert 1 but is in expert 3's file" in result.err


def test_an_autoep_run_is_refused_not_read_with_wrong_keys(tmp_path):
    """AutoEP (engine.py:5178) splits fused experts.w1 [E, ...] into per-expert keys that load_checkpoint stacks
    back: read as they are, the keys would not be the module's."""
    torch = pytest.importorskip("torch")
    tag = _copy("zero2_ep2", tmp_path)
    path = tag / "mp_rank_00_model_states.pt"
    states = torch.load(path, weights_only=True)
    states["ds_autoep_layers"] = [{"moe_layer_id": 0, "module_path": "moe1"}]
    torch.save(states, path)
    result = cli("inspect", str(tag.parent))
    assert result.code == 2 and "AutoEP" in result.err


def test_an_expert_file_beyond_num_experts_is_judged_and_left_out(tmp_path):
    torch = pytest.importorskip("torch")
    tag = _copy("zero1_ep1", tmp_path)
    torch.save({"moe2.deepspeed_moe.experts.deepspeed_experts.4.weight": torch.zeros(8, 8)},
               tag / "layer_1_expert_4_mp_rank_00_model_states.pt")
    doc = json.loads(cli("inspect", str(tag.parent), "--json").out)
    info = json.loads((MOE / "zero1_ep1" / "expected.json").read_text())
    assert {t["key"] for t in doc["tensors"]} == set(info["expected"])
    assert any("beyond the states' num_experts [4, 4]" in w and "layer_1_expert_4" in w for w in doc["warnings"])
