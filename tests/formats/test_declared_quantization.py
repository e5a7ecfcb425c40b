"""Checkpoints that declare quantization (quantization_config, or scale/zero-point companions of a weight):
inspect says so, migrate refuses a --dtype cast and never writes a folder whose config declares a quantization
its weights no longer have. Folders as DeepSeek-V3 / Qwen FP8 checkpoints ship them: float8_e4m3fn weights with
a float32 ``weight_scale_inv`` per 128x128 block and ``quantization_config`` fp8 in config.json."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckpt_tool.formats.quantization import companion_keys
from tests.helpers.bits import bits

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
W = "model.layers.0.mlp.down_proj.weight"


def _fp8_block_quantize(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's block FP8: codes = w / scale per (block x block) tile, scale_inv = amax / 448."""
    rows, cols = w.shape
    tiles = w.reshape(rows // block, block, cols // block, block)
    scale_inv = tiles.abs().amax(dim=(1, 3)) / torch.finfo(torch.float8_e4m3fn).max
    codes = (tiles / scale_inv[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
    return codes, scale_inv.float()


@pytest.fixture
def fp8_folder(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "qwen-fp8"
    folder.mkdir()
    codes, scale_inv = _fp8_block_quantize(torch.randn(256, 256))
    save_file({W: codes, f"{W}_scale_inv": scale_inv, "model.norm.weight": torch.ones(256, dtype=torch.bfloat16),
               "lm_head.weight": torch.randn(64, 256).bfloat16()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "quantization_config": FP8_CONFIG}))
    return folder


def test_inspect_names_the_declared_quantization(run_cli, fp8_folder):
    r = run_cli("inspect", str(fp8_folder))
    assert r.code == 0, r
    line = next(x for x in r.out.splitlines() if x.startswith("quantized:"))
    assert "fp8" in line and "config.json" in line and f"{W}_scale_inv" in line
    doc = json.loads(run_cli("inspect", str(fp8_folder), "--json").out)
    assert doc["quantization"] == {"method": "fp8", "config_file": "config.json", "config": FP8_CONFIG,
                                   "companions": [f"{W}_scale_inv"]}


@pytest.mark.parametrize("out_args", [["-o", "bf16.safetensors"], ["--to", "hf", "-o", "bf16_hf"],
                                      ["-o", "bf16.pth"]])
def test_dtype_cast_of_a_quantized_checkpoint_is_refused_naming_keys(run_cli, fp8_folder, tmp_path, out_args):
    out_args = [*out_args[:-1], str(tmp_path / out_args[-1])]
    r = run_cli("migrate", str(fp8_folder), *out_args, "--dtype", "bf16")
    assert r.code == 2, r
    assert "declares quantization" in r.err and repr(W) in r.err and "without their scales" in r.err
    assert not os.path.exists(out_args[-1])


def test_hf_copy_keeps_codes_scales_and_config(run_cli, fp8_folder, tmp_path):
    out = tmp_path / "copy"
    r = run_cli("migrate", str(fp8_folder), "--to", "hf", "-o", str(out))
    assert r.code == 0, r
    assert json.loads((out / "config.json").read_text())["quantization_config"] == FP8_CONFIG
    src, got = load_file(str(fp8_folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert got[W].dtype == torch.float8_e4m3fn
    for key, value in src.items():
        assert torch.equal(bits(got[key]), bits(value)), key


def test_no_folder_under_a_config_its_weights_no_longer_match(run_cli, fp8_folder, tmp_path):
    r = run_cli("migrate", str(fp8_folder), "--to", "hf", "-o", str(tmp_path / "a"), "--drop", "*_scale_inv")
    assert r.code == 2 and "declares quantization fp8" in r.err and f"{W}_scale_inv" in r.err, r
    plain = tmp_path / "plain.safetensors"
    save_file({"model.norm.weight": torch.ones(256)}, str(plain))
    r = run_cli("migrate", str(plain), "--to", "hf", "-o", str(tmp_path / "b"), "--config-from", str(fp8_folder))
    assert r.code == 2 and "hold none of its scales" in r.err, r
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_companions_alone_declare_quantization(run_cli, tmp_path):
    # GPTQ's layout (qweight/qzeros int32 packed codes, fp16 scales, g_idx) in a bare safetensors file
    path = tmp_path / "gptq.safetensors"
    p = "model.layers.0.self_attn.q_proj"
    i32 = torch.int32
    save_file({f"{p}.qweight": torch.zeros(16, 64, dtype=i32), f"{p}.qzeros": torch.zeros(1, 8, dtype=i32),
               f"{p}.scales": torch.ones(1, 64, dtype=torch.float16), f"{p}.g_idx": torch.zeros(128, dtype=i32),
               f"{p}.bias": torch.zeros(64, dtype=torch.float16)}, str(path))
    doc = json.loads(run_cli("inspect", str(path), "--json").out)
    assert doc["quantization"]["method"] is None
    assert sorted(doc["quantization"]["companions"]) == sorted(f"{p}.{n}" for n in ("qweight", "qzeros", "scales",
                                                                                     "g_idx"))
    r = run_cli("migrate", str(path), "-o", str(tmp_path / "o.safetensors"), "--dtype", "fp32")
    assert r.code == 2 and f"{p}.scales" in r.err, r


def test_a_plain_checkpoint_declares_nothing_and_casts(run_cli, tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"encoder.layer_scale": torch.ones(4), "decoder.weight": torch.ones(4, 4)}, str(path))
    r = run_cli("inspect", str(path), "--json")
    assert json.loads(r.out)["quantization"] is None
    assert "quantized:" not in run_cli("inspect", str(path)).out
    assert run_cli("migrate", str(path), "-o", str(tmp_path / "o.safetensors"), "--dtype", "bf16").code == 0


@pytest.mark.parametrize(("keys", "companions"), [
    # the names that mean quantization on their own
    (["l.weight", "l.weight_scale_inv"], ["l.weight_scale_inv"]),  # DeepSeek-V3 / Qwen FP8 blocks
    (["l.weight", "l.weight_scale", "l.input_scale"], ["l.weight_scale", "l.input_scale"]),  # static FP8
    (["l.weight", "l.SCB"], ["l.SCB"]),  # bitsandbytes int8
    (["l.weight", "l.weight.absmax", "l.weight.quant_map", "l.weight.quant_state.bitsandbytes__nf4"],
     ["l.weight.absmax", "l.weight.quant_map", "l.weight.quant_state.bitsandbytes__nf4"]),  # bitsandbytes nf4
    (["l.weight_packed", "l.weight_shape", "l.weight_scale"], ["l.weight_packed", "l.weight_shape",
                                                              "l.weight_scale"]),  # compressed-tensors
    (["l.weight._data", "l.weight._scale", "l.bias"], ["l.weight._data", "l.weight._scale"]),  # optimum-quanto
    (["e.gate_up_proj_blocks", "e.gate_up_proj_scales"], ["e.gate_up_proj_scales"]),  # MXFP4 (gpt-oss)
    # names ordinary models use: not companions without the sibling that makes them one
    (["clip.logit_scale", "vit.ls1.gamma", "enc.layer_scale"], []),
    (["anchors.scales", "head.input_scale", "head.output_scale", "x._data", "y._scale"], []),
    (["pyramid.anchor_scales", "norm.weight"], []),
])
def test_companions_by_the_libraries_names(keys, companions):
    assert companion_keys(keys) == companions


def test_every_companion_name_holds_a_prefilter_token():
    """companion_keys rules a checkpoint out by substring tokens: each name it knows must contain one."""
    from ckpt_tool.formats import quantization as q

    names = {*q.COMPANIONS, *q._WITH_SIBLING, *q.COMPANION_SUFFIXES, q._STATE_MARKER, "w_scales"}
    assert [n for n in names if not any(t in n for t in q.TOKENS)] == []
