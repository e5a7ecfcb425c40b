"""Megatron-core torch_dist checkpoints: stacked layers unstacked into per-layer names (issue 24).

The folders in fixtures/megatron/ were saved by megatron-core 0.16.1 on CPU
with gloo (fixtures/megatron/generate.py): a small GPTModel at TP=1 (dense
and MoE), TP=2, PP=2 (4 layers, two per stage) and MoE with expert
parallelism 2. Beside each, ``D.expected.safetensors`` is the state_dict of
a fresh TP=1/PP=1 model that loaded ``D`` through Megatron's own
``dist_checkpointing.load`` (resharding). ckpt's unstacked output must equal
it bit for bit, and load with ``strict=True`` into that model (one
subprocess for the module: the only place megatron is imported).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import FIXTURES

from tests.helpers.bits import bits
from tests.helpers.errors import assert_one_line_error
from tests.hostile import builders as b

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

MEGATRON = FIXTURES / "megatron"
# layout -> (global layers, MoE, ranks that saved it)
MODELS = {"dense": (2, False, 1), "moe": (2, True, 1), "tp2": (2, False, 2), "pp2": (4, False, 2),
          "moe_ep2": (2, True, 2)}
# with Megatron's DistributedOptimizer (DP=2, one Adam step): per-parameter states, and flat per-rank buckets
# (fully_reshardable gathers on DP rank 0, the only one that writes)
LAYOUTS = {**MODELS, "distopt_fully_reshardable": (2, False, 1), "distopt_dp_reshardable": (2, False, 2),
           "distopt_dp_zero": (2, False, 1)}
CONSOLIDATED = sorted(set(LAYOUTS) - {"distopt_dp_reshardable", "distopt_dp_zero"})
# The local (non-Transformer-Engine) layer spec names its norms input_layernorm / pre_mlp_layernorm; the
# checkpoint stores them under the Transformer Engine names every spec saves (its sharded_state_dict_keys_map).
_LOCAL_SPEC = [r"--rename", r"(.*)\.self_attention\.linear_qkv\.layer_norm_(weight|bias)=\1.input_layernorm.\2",
               r"--rename", r"(.*)\.mlp\.linear_fc1\.layer_norm_(weight|bias)=\1.pre_mlp_layernorm.\2"]
_TE_NAMES = {".input_layernorm.": ".self_attention.linear_qkv.layer_norm_",
             ".pre_mlp_layernorm.": ".mlp.linear_fc1.layer_norm_"}


def _expected(layout: str) -> dict[str, object]:
    return safetensors_torch.load_file(str(MEGATRON / f"{layout}.expected.safetensors"))


def _as_saved(key: str) -> str:
    """An expected (local spec) key under the name the checkpoint gives it (Transformer Engine's)."""
    for local, te in _TE_NAMES.items():
        key = key.replace(local, te)
    return key


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_fixture_is_megatrons_torch_dist_save(layout):
    """What the tests rely on: metadata.json, common.pt and each saving rank's DCP files."""
    folder = MEGATRON / layout
    assert json.loads((folder / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (folder / "common.pt").is_file() and (folder / ".metadata").is_file()
    ranks = {p.name.split("_")[2] for p in folder.glob("__*_*.distcp")}
    assert len(ranks) == LAYOUTS[layout][2]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_inspect_shows_the_stacked_global_shapes_common_pt_and_metadata_json(layout, run_cli):
    layers, moe, _ = LAYOUTS[layout]
    doc = json.loads(run_cli("inspect", "--json", str(MEGATRON / layout)).out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    # global shapes, whatever the parallelism: TP=2's halves merged, PP=2's stages on one stack
    if moe:
        assert shapes["decoder.layers.mlp.experts.experts.linear_fc1.weight"] == [layers, 4, 12, 8]
    else:
        assert shapes["decoder.layers.mlp.linear_fc1.weight"] == [layers, 24, 8]
    assert shapes["embedding.word_embeddings.weight"] == [16, 8] and shapes["output_layer.weight"] == [16, 8]
    assert any("--unstack-layers" in w for w in doc["warnings"])
    meg = doc["metadata"]["megatron"]
    assert meg["metadata.json"]["sharded_backend"] == "torch_dist" and meg["stacked_layers"] == layers
    assert meg["common.pt"]["iteration"] == 7 and meg["common.pt"]["checkpoint_version"] == 3.0
    tp, pp, ep = {"tp2": (2, 1, 1), "pp2": (1, 2, 1), "moe_ep2": (1, 1, 2)}.get(layout, (1, 1, 1))
    assert meg["parallel"] == {"tp": tp, "pp": pp, "ep": ep}  # what common.pt's args record
    text = run_cli("inspect", str(MEGATRON / layout)).out
    assert f"saved with tp={tp} pp={pp} ep={ep}" in next(x for x in text.splitlines() if x.startswith("training:"))


@pytest.mark.parametrize("layout", CONSOLIDATED)
def test_inspect_unstacked_shows_megatrons_per_layer_names(layout, run_cli):
    """Every tensor of the TP=1 model's state_dict, by name, dtype and shape; layers of every stage."""
    layers = LAYOUTS[layout][0]
    r = run_cli("inspect", "--json", "--unstack-layers", str(MEGATRON / layout))
    assert r.code == 0, r
    doc = json.loads(r.out)
    got = {t["key"]: (t["dtype"], t["shape"]) for t in doc["tensors"]}
    want = {_as_saved(k): (str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in _expected(layout).items()}
    assert got == want
    assert {k.split(".")[2] for k in got if k.startswith("decoder.layers.")} == {str(n) for n in range(layers)}
    assert not any("--unstack-layers" in w for w in doc["warnings"])
    keys = [k for k in got if k.startswith("decoder.")]  # the model's order: layer N's entries, then N+1's
    for n in range(layers - 1):
        assert max(i for i, k in enumerate(keys) if f".layers.{n}." in k) < min(
            i for i, k in enumerate(keys) if f".layers.{n + 1}." in k)


@pytest.mark.parametrize("layout", CONSOLIDATED)
def test_migrate_unstacked_equals_megatrons_own_load_bit_for_bit(layout, tmp_path, run_cli):
    out = tmp_path / "model.safetensors"
    r = run_cli("migrate", str(MEGATRON / layout), "--unstack-layers", *_LOCAL_SPEC, "-o", str(out))
    assert r.code == 0, r
    got, want = safetensors_torch.load_file(str(out)), _expected(layout)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(bits(got[k]), bits(v)), k


_LOAD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    import generate as g
    from safetensors.torch import load_file

    g.init(0, 1, sys.argv[2], g.Layout("reference"))
    for name, layers, moe, pth, expected in zip(*[iter(sys.argv[3:])] * 5):
        m = g.build(g.Layout(name, layers=int(layers), moe=moe == "1"), seed=1)  # other values than the save's
        sd = torch.load(pth, weights_only=True)
        sd["output_layer._extra_state"] = None  # GPTModel.sharded_state_dict drops it on save (always empty)
        m.load_state_dict(sd, strict=True)
        want = load_file(expected)
        got = {k: v for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}
        assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
        bad = [k for k in want if not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))]
        assert not bad, bad
        print("LOADED", name, len(got))
""")


def _rendezvous(folder: os.PathLike[str]) -> str:
    """A file rendezvous in the test's own folder: no TCP port is picked (and raced for)."""
    return "file://" + os.path.join(folder, "rendezvous")


@pytest.fixture(scope="module")
def strict_loads(tmp_path_factory) -> str:
    """Each layout migrated to .pth, then loaded strictly by TP=1 models in ONE megatron subprocess."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed (test-only: requirements-test.txt)")
    from ckpt_tool.commands.migrate import migrate

    root = tmp_path_factory.mktemp("megatron-load")
    args = []
    for layout, (layers, moe, _) in sorted(MODELS.items()):
        out = root / f"{layout}.pth"
        renames = (("(.*)\\.self_attention\\.linear_qkv\\.layer_norm_(weight|bias)", "\\1.input_layernorm.\\2"),
                   ("(.*)\\.mlp\\.linear_fc1\\.layer_norm_(weight|bias)", "\\1.pre_mlp_layernorm.\\2"))
        assert migrate(MEGATRON / layout, out, unstack_layers=True, rename=renames).ok
        args += [layout, str(layers), "1" if moe else "0", str(out), str(MEGATRON / f"{layout}.expected.safetensors")]
    script = root / "load.py"
    script.write_text(_LOAD)
    # megatron runs in this subprocess only: importing megatron.core adds argparse.Namespace, io.BytesIO,
    # NumPy's arrays and more to torch's weights_only safe globals for the whole process, which would
    # change what every later test sees torch.load(weights_only=True) accept.
    done = subprocess.run([sys.executable, str(script), str(MEGATRON), _rendezvous(root), *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("layout,count", [("dense", 29), ("moe", 57), ("tp2", 29), ("pp2", 53), ("moe_ep2", 57)])
def test_a_tp1_model_loads_the_unstacked_output_strictly(strict_loads, layout, count):
    """Layers of every stage, TP halves, and each layer's experts (SequentialMLP's names) load strictly."""
    assert f"LOADED {layout} {count}\n" in strict_loads


def test_unstacked_safetensors_holds_each_layers_bytes(tmp_path):
    from ckpt_tool.commands.migrate import migrate

    folder = MEGATRON / "pp2"
    stacked, flat = tmp_path / "stacked.safetensors", tmp_path / "flat.safetensors"
    assert migrate(folder, stacked).ok and migrate(folder, flat, unstack_layers=True, workers=2).ok
    s, f = safetensors_torch.load_file(str(stacked)), safetensors_torch.load_file(str(flat))
    for layer in range(4):  # layers 2 and 3 were saved by the second pipeline stage
        for name in ("mlp.linear_fc1.weight", "self_attention.linear_proj.bias"):
            assert torch.equal(f[f"decoder.layers.{layer}.{name}"], s[f"decoder.layers.{name}"][layer])


def test_unstack_layers_on_another_source_is_a_usage_error(tmp_path, run_cli):
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pth")
    assert_one_line_error(run_cli("inspect", "--unstack-layers", str(tmp_path / "m.pth")),
                          "--unstack-layers reads a Megatron-core torch_dist checkpoint")


def test_common_pt_is_read_without_running_it(tmp_path, run_cli):
    copy = tmp_path / "ckpt"
    shutil.copytree(MEGATRON / "dense", copy)
    ran = tmp_path / "ran"
    torch.save({"iteration": 7, "hook": b.Reduce(os.system, f"touch '{ran}'")}, copy / "common.pt")
    doc = json.loads(run_cli("inspect", "--json", str(copy)).out)
    assert doc["metadata"]["megatron"]["common.pt"]["iteration"] == 7
    assert any("posix.system" in w or "os.system" in w for w in doc["warnings"])
    assert not ran.exists()


def test_fully_reshardable_optimizer_states_are_per_parameter(run_cli):
    """Megatron's fp32 main parameters and Adam moments, gathered per parameter: unstacked with the model
    (the bit-for-bit comparison with Megatron's own DP=1 load is in the migrate test above)."""
    doc = json.loads(run_cli("inspect", "--json", "--unstack-layers", str(MEGATRON / "distopt_fully_reshardable")).out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    for state in ("param", "exp_avg", "exp_avg_sq"):
        assert shapes[f"optimizer.state.{state}.decoder.layers.1.mlp.linear_fc1.weight"] == [24, 8]
    assert doc["metadata"]["megatron"]["distributed_optimizer"]["sharding_type"] == "fully_reshardable"
    assert not any("distributed-optimizer" in w for w in doc["warnings"])


@pytest.mark.parametrize("layout,kind,buckets", [("distopt_dp_reshardable", "dp_reshardable", 1),
                                                  ("distopt_dp_zero", "dp_zero_gather_scatter", 0)])
def test_flat_optimizer_buffers_are_kept_and_said(layout, kind, buckets, tmp_path, run_cli):
    """dp_reshardable: flat per-DP-rank buckets; dp_zero_gather_scatter: the same gathered, pickled. Neither
    saves which range is which parameter."""
    folder = MEGATRON / layout
    doc = json.loads(run_cli("inspect", "--json", "--unstack-layers", str(folder)).out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    flat = {k: v for k, v in shapes.items() if k.startswith("optimizer.distributed.")}
    assert sorted(k.rsplit(".", 1)[1] for k in flat) == (["exp_avg", "exp_avg_sq", "param"] if buckets else [])
    assert all(len(v) == 1 for v in flat.values())  # 1-d, over every parameter (padded)
    assert not any(k.startswith("optimizer.state.") for k in shapes)
    if not buckets:  # the gathered state is one pickled object, never unpickled to be shown
        assert "optimizer.distributed.dp_group_idx_0.param_state" in doc["metadata"]
    meg = doc["metadata"]["megatron"]["distributed_optimizer"]
    assert meg["sharding_type"] == kind and meg["buckets"] == buckets
    said = [w for w in doc["warnings"] if "distributed-optimizer" in w]
    assert len(said) == 1 and kind in said[0] and "which range is which parameter is not saved" in said[0]
    out = tmp_path / "model.safetensors"
    r = run_cli("migrate", str(folder), "--unstack-layers", *_LOCAL_SPEC, "--drop", "optimizer.*", "-o", str(out))
    assert r.code == 0, r
    got = safetensors_torch.load_file(str(out))
    want = {k: v for k, v in _expected(layout).items() if not k.startswith("optimizer.")}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(bits(got[k]), bits(v)) for k, v in want.items())
