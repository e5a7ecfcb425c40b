"""Folders the Hugging Face libraries write, read as what their library wrote (formats/hf/folders.py).

Each layout is written by the real library (tests/helpers/hf_writers.py, one
subprocess per test session, tiny random configs, nothing downloaded), next
to the library's own state_dict. inspect must equal that state_dict (keys,
shapes, dtypes), diff against it must find nothing, gate and scan must exit
as the folder's pickles say. Where a library is not installed its layouts
are skipped with a message. The fail-closed cases need only safetensors.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, hf_folder

from tests.helpers.errors import assert_one_line_error

st = pytest.importorskip("safetensors.torch")
torch = pytest.importorskip("torch")

from ckpt_tool import load  # noqa: E402

LAYOUTS = ("bert", "bert_bin", "bert_sharded", "gpt2", "peft", "unet", "pipeline", "sentence_transformers",
           "trainer_checkpoint", "trainer_run", "accelerate")
# (library, layout) each reports in its hf_folder metadata
WRITTEN_BY = {"bert": ("transformers", "save_pretrained"), "bert_bin": ("transformers", "save_pretrained"),
              "bert_sharded": ("transformers", "save_pretrained"), "gpt2": ("transformers", "save_pretrained"),
              "peft": ("peft", "adapter"), "unet": ("diffusers", "save_pretrained"),
              "pipeline": ("diffusers", "pipeline"), "sentence_transformers": ("sentence-transformers", "modules"),
              "trainer_checkpoint": ("transformers", "trainer checkpoint"), "trainer_run": ("transformers", "run"),
              "accelerate": ("accelerate", "save_state")}
# The Trainer pickles its TrainingArguments (training_args.bin): reviewed in the catalog (issue 32), so scan and
# gate's loads-safely pass; torch.load(weights_only=True) refuses it, so gate's weights-only check fails.
FLAGGED = {"trainer_checkpoint", "trainer_run"}


@pytest.fixture(scope="session")
def written(hf_written: tuple[Path, dict[str, object]]) -> tuple[Path, dict[str, object]]:
    return hf_written  # conftest.py: the folders are written once per session, for migrate's tests too


_folder = hf_folder


def _metas(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted((t.key, t.dtype, tuple(t.shape)) for t in load(path).tensors)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inspect_equals_the_librarys_state_dict(written, layout, run_cli):
    folder, expected = _folder(written, layout)
    r = run_cli("inspect", str(folder), "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    got = sorted((t["key"], t["dtype"], tuple(t["shape"])) for t in report["tensors"])
    assert got == _metas(expected)
    meta = report["metadata"]["hf_folder"]
    assert (meta["library"], meta["layout"]) == WRITTEN_BY[layout]
    text = run_cli("inspect", str(folder)).out
    assert f"library:    {meta['library']} {meta['layout']}" in text


@pytest.mark.parametrize("layout", LAYOUTS)
def test_diff_against_the_state_dict_finds_nothing(written, layout, run_cli):
    folder, expected = _folder(written, layout)
    r = run_cli("diff", str(folder), str(expected), "--json")
    assert r.code == 0, r.out
    report = json.loads(r.out)
    assert report["equal"] and not report["missing"] and not report["unexpected"], report


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gate_and_scan_take_the_folder(written, layout, run_cli):
    folder, _ = _folder(written, layout)
    scan = run_cli("scan", str(folder), "--json")
    assert scan.code == 0, scan.out
    gate = run_cli("gate", str(folder), "--json")
    assert gate.code == (1 if layout in FLAGGED else 0), gate.out
    failed = {c["name"] for c in json.loads(gate.out)["files"][0]["checks"] if c["passed"] is False}
    assert failed == ({"weights-only"} if layout in FLAGGED else set()), failed


def test_config_json_is_reported(written, run_cli):
    folder, _ = _folder(written, "bert")
    config = json.loads(run_cli("inspect", str(folder), "--json").out)["metadata"]["hf_folder"]["config"]
    assert config["architectures"] == ["BertModel"] and config["model_type"] == "bert"
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert "tie_word_embeddings" in config


def test_peft_adapter_config_is_reported(written, run_cli):
    folder, _ = _folder(written, "peft")
    config = json.loads(run_cli("inspect", str(folder), "--json").out)["metadata"]["hf_folder"]["config"]
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert sorted(config["target_modules"]) == ["query", "value"]
    assert "base_model_name_or_path" in config


def test_pipeline_lists_its_components_and_each_is_a_folder(written, run_cli):
    folder, _ = _folder(written, "pipeline")
    meta = json.loads(run_cli("inspect", str(folder), "--json").out)["metadata"]["hf_folder"]
    comps = meta["components"]
    assert comps["unet"]["class"] == "UNet2DModel" and comps["unet"]["tensors"] > 0
    assert comps["scheduler"]["weights"] is None
    unet = run_cli("inspect", str(folder / "unet"), "--json")
    assert unet.code == 0 and json.loads(unet.out)["metadata"]["hf_folder"]["config"]["_class_name"] == "UNet2DModel"
    assert_one_line_error(run_cli("inspect", str(folder / "scheduler")), "scheduler", "no weights")


def test_sentence_transformers_modules_are_listed(written, run_cli):
    folder, _ = _folder(written, "sentence_transformers")
    modules = json.loads(run_cli("inspect", str(folder), "--json").out)["metadata"]["hf_folder"]["modules"]
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
    assert modules[0]["weights"] == "model.safetensors" and modules[1]["weights"] is None


def test_trainer_files_are_listed_with_their_verdicts(written, run_cli):
    folder, _ = _folder(written, "trainer_checkpoint")
    wo = json.loads(run_cli("inspect", str(folder), "--json").out)["weights_only"]
    files = {f["path"]: f for f in wo["files"]}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"} <= set(files)
    assert files["optimizer.pt"]["loads"] and files["rng_state.pth"]["loads"]  # the Trainer allowlists NumPy's
    assert files["training_args.bin"]["loads"] is False


def test_accelerate_state_files_are_listed(written, run_cli):
    folder, _ = _folder(written, "accelerate")
    files = {f["path"] for f in json.loads(run_cli("inspect", str(folder), "--json").out)["weights_only"]["files"]}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= files


def test_a_run_folder_reads_its_latest_checkpoint(written, run_cli, tmp_path):
    folder, _ = _folder(written, "trainer_checkpoint")
    run = tmp_path / "run"
    for step in (2, 9, 10):
        shutil.copytree(folder, run / f"checkpoint-{step}")
    r = run_cli("inspect", str(run), "--json")
    meta = json.loads(r.out)["metadata"]["hf_folder"]
    assert meta["run"]["latest"] == "checkpoint-10" and meta["run"]["others"] == ["checkpoint-2", "checkpoint-9"]
    assert "checkpoint-10/optimizer.pt" in {f["path"] for f in json.loads(r.out)["weights_only"]["files"]}
    assert "checkpoint: checkpoint-10 (the latest)" in run_cli("inspect", str(run)).out


def test_migrate_reads_a_save_pretrained_folder(written, run_cli, tmp_path):
    folder, expected = _folder(written, "bert")
    out = tmp_path / "x.safetensors"
    assert run_cli("migrate", f"{folder}/", "-o", str(out)).code == 0
    assert run_cli("diff", str(out), str(expected), "--values").code == 0


# Fail closed: the folders below are built by hand (no library needed).

def _config(folder: Path, **extra: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Tiny"], "model_type": "tiny", **extra}))
    return folder


def _weights(path: Path) -> None:
    st.save_file({"w": torch.zeros(2)}, str(path))


def test_safetensors_is_preferred_over_bin_and_the_bin_still_judged(tmp_path, run_cli):
    folder = _config(tmp_path / "m")
    _weights(folder / "model.safetensors")
    torch.save({"w": torch.ones(3)}, folder / "pytorch_model.bin")
    report = json.loads(run_cli("inspect", str(folder), "--json").out)
    assert report["metadata"]["hf_folder"]["weights"] == "model.safetensors"
    assert [t["shape"] for t in report["tensors"]] == [[2]]
    assert any("pytorch_model.bin is not read" in w for w in report["warnings"])
    assert "pytorch_model.bin" in {f["path"] for f in report["weights_only"]["files"]}


def test_a_config_without_weights_is_an_error_naming_the_files(tmp_path, run_cli):
    folder = _config(tmp_path / "m")
    assert_one_line_error(run_cli("inspect", str(folder)), "no model.safetensors", "holds no weights file")
    _weights(folder / "model.fp16.safetensors")
    assert_one_line_error(run_cli("inspect", str(folder)), "model.fp16.safetensors")
    gate = run_cli("gate", str(folder), "--json")
    checks = {c["name"]: c for c in json.loads(gate.out)["files"][0]["checks"]}
    assert gate.code == 2 and not checks["readable"]["passed"], gate.out


def test_two_accelerate_models_are_an_error(tmp_path, run_cli):
    folder = tmp_path / "state"
    folder.mkdir()
    _weights(folder / "model.safetensors")
    _weights(folder / "model_1.safetensors")
    torch.save({}, folder / "optimizer.bin")
    assert_one_line_error(run_cli("inspect", str(folder)), "model.safetensors", "model_1.safetensors")


def test_a_folder_of_no_library_is_still_refused(tmp_path, run_cli):
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_line_error(run_cli("inspect", str(tmp_path)), "folder holds no checkpoint")


def test_json_that_names_a_folder_outside_is_refused(tmp_path, run_cli):
    outside = _config(tmp_path / "outside", _class_name="UNet2DModel")
    _weights(outside / "diffusion_pytorch_model.safetensors")
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "P", "unet": ["diffusers", "UNet2DModel"],
                                                       "../outside": ["diffusers", "UNet2DModel"]}))
    (pipe / "unet").symlink_to(outside, target_is_directory=True)
    assert_one_line_error(run_cli("inspect", str(pipe)), "model_index.json", "'../outside'", "outside the folder")
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "P", "unet": ["diffusers", "UNet2DModel"]}))
    assert_one_line_error(run_cli("inspect", str(pipe)), "'unet'", "through a symbolic link")
    st_folder = tmp_path / "st"
    st_folder.mkdir()
    (st_folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "../outside",
                                                         "type": "sentence_transformers.models.Transformer"}]))
    assert_one_line_error(run_cli("inspect", str(st_folder)), "modules.json", "outside the folder")


# layout -> (factory in tests/helpers/hf_targets.py, the folder whose config builds it: "" the layout's own)
TARGETS = {"bert": "transformers_model", "bert_bin": "transformers_model", "bert_sharded": "transformers_model",
           "sentence_transformers": "transformers_model", "trainer_checkpoint": "transformers_model",
           "unet": "diffusers_model"}


@pytest.mark.parametrize("layout", list(TARGETS))
def test_diff_against_the_librarys_class_finds_nothing(written, layout, run_cli):
    folder, _ = _folder(written, layout)
    spec = f"{ROOT / 'tests' / 'helpers' / 'hf_targets.py'}:{TARGETS[layout]}"
    r = run_cli("diff", str(folder), "--target", spec, "--target-kwargs", json.dumps({"folder": str(folder)}),
                "--json")
    assert r.code == 0, r.out
    report = json.loads(r.out)
    assert report["equal"] and not report["missing"] and not report["unexpected"] and not report["shape_mismatch"]


def test_a_pipeline_component_against_its_class_finds_nothing(written, run_cli):
    folder, _ = _folder(written, "pipeline")
    unet = folder / "unet"
    r = run_cli("diff", str(unet), "--target", f"{ROOT / 'tests' / 'helpers' / 'hf_targets.py'}:diffusers_model",
                "--target-kwargs", json.dumps({"folder": str(unet)}), "--json")
    assert r.code == 0 and json.loads(r.out)["equal"], r.out


def test_a_tied_head_against_its_class_is_the_tie_and_nothing_else(written, run_cli):
    folder, _ = _folder(written, "gpt2")
    r = run_cli("diff", str(folder), "--target", f"{ROOT / 'tests' / 'helpers' / 'hf_targets.py'}:transformers_model",
                "--target-kwargs", json.dumps({"folder": str(folder)}), "--json")
    report = json.loads(r.out)
    assert r.code == 1 and report["missing"] == ["lm_head.weight"] and not report["unexpected"]
    assert report["tied"] == [{"key": "lm_head.weight", "filled_by": "transformer.wte.weight"}], report
