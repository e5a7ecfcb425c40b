"""DeepSpeed pipeline-parallel runs consolidated (issue 24).

fixtures/deepspeed_parallel/pipeline/ was written by DeepSpeed 0.19.8 itself
(fixtures/deepspeed_parallel/generate.py: a PipelineModule of 6 layers over 2
stages, pp=2, tp=1, ZeRO-1, one AdamW step on CPU); ``expected.safetensors``
is the two stages' live ``module.state_dict()`` after that step. Reading
needs no DeepSpeed: these tests run in the core suite.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from tests.helpers.bits import assert_bit_equal, bits
from tests.helpers.errors import assert_one_line_error

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

RUN = ROOT / "fixtures" / "deepspeed_parallel" / "pipeline"


def _read(path: Path) -> dict:
    return torch.load(path, weights_only=True) if path.suffix == ".pth" else st.load_file(str(path))


def test_inspect_names_layers_as_pipeline_module_does():
    """Keys are ``<global layer index>.<name>``, as PipelineModule.state_dict() and param_shapes name them."""
    ck = load(RUN)
    expected = json.loads((RUN / "expected.json").read_text())["expected"]
    assert [t.key for t in ck.tensors] == ["0.weight", "0.bias", "2.weight", "2.bias", "3.scale", "3.shift",
                                           "4.weight", "4.bias", "5.weight", "5.bias"]
    assert {t.key: [t.dtype, list(t.shape)] for t in ck.tensors} == {
        k: [v["dtype"], v["shape"]] for k, v in expected.items()}
    info = ck.metadata["deepspeed"]
    assert (info["layout"], info["pp"], info["tp"]) == ("pipeline", 2, 1)


def test_inspect_cli_reports_the_parallelism(run_cli):
    r = run_cli("inspect", str(RUN))
    assert r.code == 0, r
    assert "pp=2" in r.out and "3.shift" in r.out


@pytest.mark.parametrize(("ext", "workers"), [(".safetensors", 1), (".safetensors", 2), (".pth", 1)])
def test_migrate_equals_the_live_modules_bit_for_bit(tmp_path, ext, workers):
    out = tmp_path / f"model{ext}"
    report = migrate(RUN, out, workers=workers)
    assert report.ok and report.written
    assert_bit_equal(_read(out), st.load_file(str(RUN / "expected.safetensors")))


def test_workers_write_the_same_bytes(tmp_path):
    one, two = tmp_path / "1.safetensors", tmp_path / "2.safetensors"
    assert migrate(RUN, one, workers=1).ok and migrate(RUN, two, workers=2).ok
    assert one.read_bytes() == two.read_bytes()


def test_a_missing_layer_file_is_one_clear_error(tmp_path, run_cli):
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("*.safetensors", "*.json"))
    (run / "global_step1" / "layer_03-model_states.pt").unlink()
    r = run_cli("migrate", str(run), "-o", str(tmp_path / "out.safetensors"))
    assert_one_line_error(r, "layer_03", "missing", "pp=2", "tp=1")
    assert not (tmp_path / "out.safetensors").exists()


def test_a_missing_stage_is_one_clear_error(tmp_path, run_cli):
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("*.safetensors", "*.json"))
    (run / "global_step1" / "mp_rank_01_model_states.pt").unlink()
    (run / "global_step1" / "zero_pp_rank_0_mp_rank_01_optim_states.pt").unlink()
    assert_one_line_error(run_cli("inspect", str(run)), "pp=2", "1 mp_rank_XX")


def test_one_layer_file_points_at_the_run(run_cli):
    r = run_cli("inspect", str(RUN / "global_step1" / "layer_00-model_states.pt"))
    assert r.code == 0, r
    assert "DeepSpeed checkpoint" in r.out + r.err


TIED = ROOT / "fixtures" / "deepspeed_parallel" / "pipeline_tied"


def test_tied_layers_take_pipeline_modules_name(tmp_path):
    """A TiedLayerSpec is saved in the layer file of each index it sits at (layer_00 and layer_04) but is one
    parameter, ``tied_modules.embed.weight``, in PipelineModule.state_dict(): one key, as there."""
    ck = load(TIED)
    assert sorted(t.key for t in ck.tensors) == ["1.bias", "1.weight", "3.bias", "3.weight",
                                                 "tied_modules.embed.weight"]
    assert any("tied weight(s) tied_modules.embed.weight are held by more than one pipeline stage" in w
               for w in ck.warnings)
    out = tmp_path / "model.safetensors"
    assert migrate(TIED, out).ok
    assert_bit_equal(_read(out), st.load_file(str(TIED / "expected.safetensors")))


def test_a_run_without_optimizer_files_reads_the_layer_files(tmp_path):
    """ZeRO stage 0 (or the optimizer states left behind): the weights are the layer files' own."""
    for src in (RUN, TIED):
        run = tmp_path / src.name
        shutil.copytree(src, run, ignore=shutil.ignore_patterns("*.safetensors", "*.json", "*_optim_states.pt"))
        out = tmp_path / f"{src.name}.safetensors"
        assert migrate(run, out).ok
        assert_bit_equal(_read(out), st.load_file(str(src / "expected.safetensors")))  # fp32: layers == masters


def test_pipeline_and_tensor_parallel_together(tmp_path):
    """pp=2 x tp=2 in DeepSpeed's layout (written with torch.save: mp_rank_XX is stage XX // 2, tp rank XX % 2;
    layer_NN-model_TT-model_states.pt per layer and tp rank; ZeRO-0), merged by its universal_checkpoint_info."""
    from collections import OrderedDict

    g = torch.Generator().manual_seed(0)
    full = OrderedDict()
    for n in range(4):  # column-parallel 0 and 2, row-parallel 1 and 3
        shape = (16, 8) if n % 2 == 0 else (8, 16)
        full[f"{n}.weight"] = torch.randn(*shape, generator=g)
        full[f"{n}.bias"] = torch.randn(shape[0], generator=g)
    split = {k: (None if k.endswith(".bias") and int(k[0]) % 2 else 1 if int(k[0]) % 2 else 0) for k in full}
    info = {"tp_replicated_parameter_patterns": [r"[13]\.bias$"],
            "parameter_with_row_parallelism_patterns": [r"[13]\.weight$"]}
    tag = tmp_path / "run" / "global_step1"
    tag.mkdir(parents=True)
    (tmp_path / "run" / "latest").write_text("global_step1")
    for stage in range(2):
        for tp in range(2):
            shards = {}
            for n in (2 * stage, 2 * stage + 1):
                layer = OrderedDict()
                for name in ("weight", "bias"):
                    key = f"{n}.{name}"
                    dim = split[key]
                    layer[name] = full[key].clone() if dim is None else full[key].chunk(2, dim)[tp].clone()
                    shards[key] = layer[name]
                torch.save(layer, tag / f"layer_{n:02d}-model_{tp:02d}-model_states.pt")
            torch.save({"module": None, "buffer_names": [], "dp_world_size": 1, "mp_world_size": 4,
                        "param_shapes": [OrderedDict((k, v.shape) for k, v in shards.items())],
                        "checkpoint_parallel_dimensions": {"pp_degree": 2, "tp_degree": 2},
                        "universal_checkpoint_info": info}, tag / f"mp_rank_{2 * stage + tp:02d}_model_states.pt")
    ck = load(tmp_path / "run")
    assert [(t.key, list(t.shape)) for t in ck.tensors] == [(k, list(v.shape)) for k, v in full.items()]
    out = tmp_path / "model.safetensors"
    assert migrate(tmp_path / "run", out, workers=2).ok
    assert_bit_equal(_read(out), dict(full))


BF16 = ROOT / "fixtures" / "deepspeed_parallel" / "pipeline_bf16"


def test_a_bf16_pipeline_gives_the_fp32_masters(tmp_path):
    """Trained in bf16: the layer files hold bf16, the stages' ZeRO-1 files the fp32 masters, which ckpt writes
    (as for data-parallel runs); rounded to bf16 they are the live modules' weights exactly. The buffer is as saved."""
    ck = load(BF16)
    assert {t.dtype for t in ck.tensors} == {"float32"}
    out = tmp_path / "model.safetensors"
    assert migrate(BF16, out).ok
    got, live = _read(out), st.load_file(str(BF16 / "expected.safetensors"))
    assert sorted(got) == sorted(live)
    for k, v in live.items():
        assert got[k].dtype == torch.float32, k
        assert torch.equal(bits(got[k].to(v.dtype)), bits(v)), k
    assert live["3.shift"].dtype == torch.float32  # DeepSpeed leaves the buffer fp32; so does ckpt
    assert not torch.equal(got["0.weight"], got["0.weight"].to(torch.bfloat16).float())  # masters, not bf16 copies
