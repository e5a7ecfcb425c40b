"""migrate --to hf: a Hugging Face folder that the library's own from_pretrained loads with equal values.

The source folders are written by the real libraries (tests/helpers/hf_writers.py,
once a session); each migrated folder is then loaded in one subprocess by
its library (tests/helpers/hf_loaders.py: ``from_pretrained``,
``PeftModel.from_pretrained``, ``SentenceTransformer``) and the tensors it
holds are compared bit for bit with the library's own state_dict. Where a
library is not installed its cases are skipped with a message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cli, hf_folder

from tests.helpers.errors import assert_one_line_error

pytest.importorskip("safetensors.torch")

# layout -> (loader in tests/helpers/hf_loaders.py, extra migrate options, weights files the output must hold)
CASES = {
    "bert": ("transformers", (), ("model.safetensors",)),
    "bert_bin": ("transformers", (), ("model.safetensors",)),
    "bert_sharded": ("transformers", ("--max-shard-size", "10KB"), ("model.safetensors.index.json",)),
    "gpt2": ("transformers", (), ("model.safetensors",)),
    "peft": ("peft", (), ("adapter_model.safetensors",)),
    "unet": ("diffusers", ("--max-shard-size", "20KB"), ("diffusion_pytorch_model.safetensors.index.json",)),
    "sentence_transformers": ("sentence-transformers", (), ("model.safetensors",)),
    "trainer_checkpoint": ("transformers", (), ("model.safetensors",)),
    "trainer_run": ("transformers", (), ("model.safetensors",)),
}
LIBRARY_MODULE = {"transformers": "transformers", "peft": "peft", "diffusers": "diffusers",
                  "sentence-transformers": "sentence_transformers"}


@pytest.fixture(scope="module")
def migrated(hf_written: tuple[Path, dict[str, object]], tmp_path_factory: pytest.TempPathFactory):
    """layout -> (source, output, migrate's JSON report, the library's verdict on loading the output)."""
    out_root = tmp_path_factory.mktemp("hf-out")
    reports: dict[str, tuple[Path, Path, dict[str, object]]] = {}
    spec = []
    for layout, (loader, extra, _) in CASES.items():
        if isinstance(hf_written[1].get(layout), dict):
            continue
        src, expected = hf_folder(hf_written, layout)
        out = out_root / layout
        r = cli("migrate", str(src), "-o", str(out), "--to", "hf", *extra, "--json")  # in-process: no start-up
        assert r.code == 0, (layout, r.out[-2000:], r.err[-2000:])
        reports[layout] = (src, out, json.loads(r.out))
        spec.append({"name": layout, "loader": loader, "folder": str(out), "expected": str(expected)})
    bf16 = out_root / "bert_bf16"
    if "bert" in reports:
        src, expected = hf_folder(hf_written, "bert")
        r = cli("migrate", str(src), "-o", str(bf16), "--to", "hf", "--dtype", "bf16", "--json")
        assert r.code == 0, r.err[-2000:]
        reports["bert_bf16"] = (src, bf16, json.loads(r.out))
        spec.append({"name": "bert_bf16", "loader": "transformers", "folder": str(bf16), "expected": str(expected),
                     "dtype": "bfloat16"})
    spec_path = out_root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "hf_loaders.py"), str(spec_path)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    verdicts = json.loads(p.stdout.strip().splitlines()[-1])
    return {k: (*v, verdicts[k]) for k, v in reports.items()}


def _case(migrated, layout: str):
    if layout not in migrated:
        pytest.skip(f"{layout}: its library is not installed (pip install -r requirements-test.txt)")
    return migrated[layout]


@pytest.mark.parametrize("layout", [*CASES, "bert_bf16"])
def test_the_librarys_loader_reads_the_output_with_equal_values(migrated, layout):
    _, out, report, verdict = _case(migrated, layout)
    assert verdict == "ok", verdict
    assert report["written"] and report["format"] == "hf-folder"
    for name in CASES.get(layout, CASES["bert"])[2]:
        assert (out / name).is_file(), sorted(os.listdir(out))
    assert not [n for n in os.listdir(out) if n.endswith((".bin", ".pt", ".pth"))]  # safetensors only


@pytest.mark.parametrize("layout", list(CASES))
def test_every_small_file_is_copied_byte_for_byte(migrated, layout):
    src, out, report, _ = _case(migrated, layout)
    source_folder = src / "checkpoint-2" if layout == "trainer_run" else src
    assert report["copied"], report
    for rel in report["copied"]:
        assert (out / rel).read_bytes() == (source_folder / rel).read_bytes(), rel
    assert "config.json" in report["copied"] or "adapter_config.json" in report["copied"]


def test_training_state_is_left_behind_and_said(migrated):
    _, out, report, _ = _case(migrated, "trainer_checkpoint")
    left = {e["file"]: e["why"] for e in report["left_out"]}
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "trainer_state.json"):
        assert name in left and "training state" in left[name], left
        assert not (out / name).exists()


def test_a_cast_rewrites_the_configs_dtype_and_nothing_else(migrated):
    src, out, report, _ = _case(migrated, "bert_bf16")
    old = json.loads((src / "config.json").read_text())
    new = json.loads((out / "config.json").read_text())
    field = "dtype" if "dtype" in old else "torch_dtype"
    assert new[field] == "bfloat16" and old[field] != "bfloat16"
    assert {k: v for k, v in new.items() if k != field} == {k: v for k, v in old.items() if k != field}
    assert any("config.json: its dtype field rewritten to bfloat16" in w for w in report["warnings"])


def test_the_sharded_index_names_every_shard(migrated):
    _, out, report, _ = _case(migrated, "unet")
    index = json.loads((out / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards == sorted(report["shards"])
    assert all(s.startswith("diffusion_pytorch_model-") and (out / s).is_file() for s in shards)


def test_inspect_of_the_output_is_the_source(migrated, run_cli):
    src, out, _, _ = _case(migrated, "bert")
    a = json.loads(run_cli("inspect", str(src), "--json").out)
    b = json.loads(run_cli("inspect", str(out), "--json").out)
    assert [(t["key"], t["dtype"], t["shape"]) for t in a["tensors"]] == \
        [(t["key"], t["dtype"], t["shape"]) for t in b["tensors"]]
    assert b["metadata"]["hf_folder"]["library"] == "transformers"


def test_a_plain_file_with_config_from_gets_the_folders_files(hf_written, tmp_path, run_cli):
    src, _ = hf_folder(hf_written, "bert_bin")
    r = run_cli("migrate", str(src / "pytorch_model.bin"), "-o", str(tmp_path / "out"), "--to", "hf")
    assert r.code == 0, r.out
    assert "no config.json" in r.out and f"--config-from {src}" in r.out  # the folder beside it is named
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors"]
    r = run_cli("migrate", str(src / "pytorch_model.bin"), "-o", str(tmp_path / "with"), "--to", "hf",
                "--config-from", str(src))
    assert r.code == 0, r.out
    assert (tmp_path / "with" / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert "copied:" in r.out


def test_force_replaces_an_earlier_output_but_never_a_foreign_folder(hf_written, tmp_path, run_cli):
    src, _ = hf_folder(hf_written, "bert")
    out = tmp_path / "out"
    assert run_cli("migrate", str(src), "-o", str(out), "--to", "hf").code == 0
    assert run_cli("migrate", str(src), "-o", str(out), "--to", "hf", "--dtype", "fp16", "--force").code == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    (out / "notes.txt").write_text("mine")
    r = run_cli("migrate", str(src), "-o", str(out), "--to", "hf", "--force")
    assert r.code == 2 and "notes.txt" in r.err
    assert (out / "notes.txt").read_text() == "mine"


def test_usage_errors_are_one_line(hf_written, tmp_path, run_cli):
    pipeline, _ = hf_folder(hf_written, "pipeline")
    r = run_cli("migrate", str(pipeline), "-o", str(tmp_path / "p"), "--to", "hf")
    assert_one_line_error(r)
    assert "give a component" in r.err and "unet" in r.err
    peft, _ = hf_folder(hf_written, "peft")
    r = run_cli("migrate", str(peft), "-o", str(tmp_path / "a"), "--to", "hf", "--max-shard-size", "1KB")
    assert_one_line_error(r)
    assert "one adapter_model.safetensors" in r.err
    r = run_cli("migrate", str(peft), "-o", str(tmp_path / "b.safetensors"), "--config-from", str(peft))
    assert_one_line_error(r)
    assert "--to hf" in r.err
    assert not list(tmp_path.iterdir())


def test_the_fix_diff_prints_for_a_folder_runs_and_loads(hf_written, tmp_path, run_cli):
    import shlex

    run, _ = hf_folder(hf_written, "trainer_run")
    bert, _ = hf_folder(hf_written, "bert")
    r = run_cli("diff", str(run), str(bert), "--json")
    command = json.loads(r.out)["suggestion"]["command"]
    assert "--to hf" in command and "--drop 'classifier.*'" in command, command
    args = shlex.split(command)[1:]
    out = tmp_path / "fixed"
    args[args.index("-o") + 1] = str(out)
    r = run_cli(*args)
    assert r.code == 0, r.out
    r = run_cli("diff", str(out), str(bert), "--json")
    assert r.code == 0 and json.loads(r.out)["equal"], r.out


def test_workers_for_an_output_written_by_one_process_are_said(tmp_path, run_cli, fixtures_dir):
    r = run_cli("migrate", str(fixtures_dir / "tiny_mlp.pth"), "-o", str(tmp_path / "out"), "--to", "hf",
                "--workers", "2", "--json")
    assert r.code == 0, r.out
    assert any(w.startswith("--workers 2: a hf-folder output is written by this one process")
               for w in json.loads(r.out)["warnings"])


def test_an_accelerate_folder_has_no_config_to_copy_and_says_so(hf_written, tmp_path, run_cli):
    from safetensors.torch import load_file

    src, expected = hf_folder(hf_written, "accelerate")
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "out"), "--to", "hf", "--json")
    assert r.code == 0, r.out
    report = json.loads(r.out)
    assert not report["copied"] and any("no config.json" in w for w in report["warnings"])
    assert {e["file"] for e in report["left_out"]} >= {"optimizer.bin", "scheduler.bin"}
    got, want = load_file(tmp_path / "out" / "model.safetensors"), load_file(expected)
    assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)


def test_the_fix_names_the_keys_it_drops(hf_written, run_cli):
    run, _ = hf_folder(hf_written, "trainer_run")
    bert, _ = hf_folder(hf_written, "bert")
    r = run_cli("diff", str(run), str(bert))
    assert "leaves out 2 the other side lacks (classifier.bias, classifier.weight)" in r.out, r.out
    r = run_cli("diff", str(run), str(bert), "--json")
    assert json.loads(r.out)["suggestion"]["dropped_keys"] == ["classifier.bias", "classifier.weight"]


def test_a_sub_folder_is_never_dropped_unsaid(hf_written, tmp_path, run_cli):
    import shutil

    src, _ = hf_folder(hf_written, "bert")
    folder = tmp_path / "bert"
    shutil.copytree(src, folder)
    (folder / "runs").mkdir()
    (folder / "runs" / "events.out").write_text("x")
    r = run_cli("migrate", str(folder), "-o", str(tmp_path / "out"), "--to", "hf", "--json")
    assert r.code == 0, r.out
    left = {e["file"]: e["why"] for e in json.loads(r.out)["left_out"]}
    assert "runs/" in left and "does not read" in left["runs/"]
    assert not (tmp_path / "out" / "runs").exists()
