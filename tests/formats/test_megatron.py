"""Megatron-core torch_dist checkpoints: stacked layers unstacked into per-layer names (issue 24).

megatron-core 0.16.1 (test-only) saves a small GPTModel (TP=1, PP=1, 2
layers, gated MLP) with ``dist_checkpointing.save`` on CPU, once
``torch.cuda.synchronize`` and ``torch.cuda.current_device`` are stubbed.
The unstacked output must load with ``strict=True`` into the same model
built afresh, with every value equal to the model that was saved.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.hostile import builders as b

torch = pytest.importorskip("torch")
# Looked for, never imported here: importing megatron.core adds argparse.Namespace, io.BytesIO, NumPy's
# arrays and more to torch's weights_only safe globals for the whole process, which would change what
# every later test sees torch.load(weights_only=True) accept. megatron runs in the subprocesses below only.
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed (test-only: requirements-test.txt)", allow_module_level=True)

_MODEL = textwrap.dedent("""
    import os, sys, torch

    def setup(port):
        torch.cuda.synchronize = lambda *a, **k: None  # megatron's torch_dist save calls them; nothing to sync on CPU
        torch.cuda.current_device = lambda: "cpu"
        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo", rank=0, world_size=1)
        from megatron.core import parallel_state
        parallel_state.initialize_model_parallel(1, 1)

    def model(seed, moe):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig
        torch.manual_seed(seed)
        experts = dict(num_moe_experts=4, moe_ffn_hidden_size=6, moe_router_topk=2) if moe else {}
        cfg = TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12,
                                use_cpu_initialization=True, gated_linear_unit=True, **experts)
        spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False) if moe else get_gpt_layer_local_spec()
        return GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=16, max_sequence_length=8)

    def main(mode, folder, port):
        setup(port)
        if mode == "save":  # a dense model in FOLDER, a 4-expert MoE (SequentialMLP) one in FOLDER-moe
            from megatron.core import dist_checkpointing
            for where, moe in ((folder, False), (folder + "-moe", True)):
                m = model(0, moe)
                os.makedirs(where)
                dist_checkpointing.save(m.sharded_state_dict(), where)
                torch.save({k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)},
                           where + ".reference.pt")
            return
        m = model(1, folder.endswith("-moe"))  # other values: the load must bring the saved ones back
        sd = torch.load(sys.argv[4], weights_only=True)
        sd["output_layer._extra_state"] = None  # GPTModel.sharded_state_dict drops it on save (always empty)
        m.load_state_dict(sd, strict=True)
        want = torch.load(folder + ".reference.pt", weights_only=True)
        got = {k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}
        assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
        bad = [k for k in want if not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))]
        assert not bad, bad
        print("LOADED", len(got))

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], sys.argv[3])
""")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(script), args[0], args[1], _free_port(), *args[2:]],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("megatron")
    script = root / "model.py"
    script.write_text(_MODEL)
    _run(script, "save", str(root / "ckpt"))
    return root / "ckpt", script


def test_the_save_stacks_layers_and_experts(saved, run_cli):
    """What the tests rely on: megatron wrote a torch_dist DCP folder with common.pt, layers (experts) stacked."""
    folder, _ = saved
    assert json.loads((folder / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (folder / "common.pt").is_file() and (folder / ".metadata").is_file()
    moe = json.loads(run_cli("inspect", "--json", str(folder.with_name(folder.name + "-moe"))).out)
    shapes = {t["key"]: t["shape"] for t in moe["tensors"]}
    assert shapes["decoder.layers.mlp.experts.experts.linear_fc1.weight"] == [2, 4, 12, 8]


def test_inspect_reports_the_stacking_common_pt_and_metadata_json(saved, run_cli):
    folder, _ = saved
    doc = json.loads(run_cli("inspect", "--json", str(folder)).out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    assert shapes["decoder.layers.mlp.linear_fc1.weight"] == [2, 24, 8]
    assert any("--unstack-layers" in w for w in doc["warnings"])
    meg = doc["metadata"]["megatron"]
    assert meg["metadata.json"]["sharded_backend"] == "torch_dist" and meg["stacked_layers"] == 2
    assert "common.pt" in meg


def test_inspect_unstacked_shows_megatrons_per_layer_names(saved, run_cli):
    folder, _ = saved
    r = run_cli("inspect", "--json", "--unstack-layers", str(folder))
    assert r.code == 0, r
    doc = json.loads(r.out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == [24, 8]
    assert shapes["decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"] == [8]
    assert not any(k.startswith("decoder.layers.") and k.split(".")[2] not in "01" for k in shapes)
    assert not any("--unstack-layers" in w for w in doc["warnings"])
    keys = list(shapes)  # the model's order: every entry of layer 0 before layer 1's
    assert max(i for i, k in enumerate(keys) if ".layers.0." in k) < min(i for i, k in enumerate(keys)
                                                                         if ".layers.1." in k)


# The local (non-Transformer-Engine) layer spec names its norms input_layernorm / pre_mlp_layernorm; the
# checkpoint stores them under the Transformer Engine names every spec saves (its sharded_state_dict_keys_map).
_LOCAL_SPEC = [r"--rename", r"(.*)\.self_attention\.linear_qkv\.layer_norm_(weight|bias)=\1.input_layernorm.\2",
               r"--rename", r"(.*)\.mlp\.linear_fc1\.layer_norm_(weight|bias)=\1.pre_mlp_layernorm.\2"]


@pytest.mark.parametrize("moe,count", [(False, 29), (True, 57)])
def test_a_tp1_model_loads_the_unstacked_output_strictly(saved, tmp_path, run_cli, moe, count):
    """Layers, and with MoE each layer's experts (SequentialMLP's local_experts.N names), load strictly."""
    folder, script = saved
    folder = folder.with_name(folder.name + "-moe") if moe else folder
    out = tmp_path / "model.pth"
    r = run_cli("migrate", str(folder), "--unstack-layers", *_LOCAL_SPEC, "-o", str(out))
    assert r.code == 0, r
    done = _run(script, "load", str(folder), str(out))
    assert f"LOADED {count}" in done.stdout


def test_unstacked_safetensors_holds_each_layers_bytes(saved, tmp_path):
    from safetensors.torch import load_file

    from ckpt_tool.commands.migrate.command import migrate

    folder, _ = saved
    stacked, flat = tmp_path / "stacked.safetensors", tmp_path / "flat.safetensors"
    assert migrate(folder, stacked).ok and migrate(folder, flat, unstack_layers=True, workers=2).ok
    s, f = load_file(str(stacked)), load_file(str(flat))
    for layer in (0, 1):
        for name in ("mlp.linear_fc1.weight", "self_attention.linear_proj.bias"):
            assert torch.equal(f[f"decoder.layers.{layer}.{name}"], s[f"decoder.layers.{name}"][layer])


def test_unstack_layers_on_another_source_is_a_usage_error(tmp_path, run_cli):
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pth")
    assert_one_line_error(run_cli("inspect", "--unstack-layers", str(tmp_path / "m.pth")),
                          "--unstack-layers reads a Megatron-core torch_dist checkpoint")


def test_common_pt_is_read_without_running_it(saved, tmp_path, run_cli):
    folder, _ = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(folder, copy)
    ran = tmp_path / "ran"
    torch.save({"iteration": 7, "hook": b.Reduce(os.system, f"touch '{ran}'")}, copy / "common.pt")
    doc = json.loads(run_cli("inspect", "--json", str(copy)).out)
    assert doc["metadata"]["megatron"]["common.pt"]["iteration"] == 7
    assert any("posix.system" in w or "os.system" in w for w in doc["warnings"])
    assert not ran.exists()


def test_optimizer_states_are_unstacked_or_kept_flat_and_said(tmp_path, run_cli):
    """Megatron's optimizer keys, as its distrib_optimizer.py names them, in a folder torch's DCP writes.

    fully_sharded_model_space: ``optimizer.state.<exp_avg|...>.<parameter key>`` with the parameter's
    (stacked) shape, unstacked like it; dp_reshardable: flat buckets under ``optimizer.distributed.``, kept.
    (A real distributed optimizer needs CUDA tensors: megatron refuses CPU parameters.)
    """
    import warnings

    import torch.distributed.checkpoint as dcp

    w = torch.arange(24.0).reshape(2, 4, 3)
    sd = {"decoder.layers.mlp.linear_fc1.weight": w,
          "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight": w * 2,
          "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_0.param":
              torch.ones(30)}
    folder = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... assuming a single process"
        dcp.save(sd, checkpoint_id=str(folder))
    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                      "common_backend": "torch", "common_backend_version": 1}))
    doc = json.loads(run_cli("inspect", "--json", "--unstack-layers", str(folder)).out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    assert shapes["optimizer.state.exp_avg.decoder.layers.1.mlp.linear_fc1.weight"] == [4, 3]
    assert any("optimizer.distributed." in k and v == [30] for k, v in shapes.items())
    assert any("flat per-rank buckets" in w for w in doc["warnings"])
    out = tmp_path / "out.safetensors"
    assert run_cli("migrate", str(folder), "--unstack-layers", "--drop", "optimizer.*", "-o", str(out)).code == 0
    from safetensors.torch import load_file

    got = load_file(str(out))
    assert sorted(got) == ["decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(got["decoder.layers.1.mlp.linear_fc1.weight"], w[1])
