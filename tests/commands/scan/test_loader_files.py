"""Every file a layout's own loader opens is judged by inspect, scan and gate alike (issue 32).

Source of the case: issue 32 ("a DeepSpeed run folder whose payload sits in a
MoE expert file, ``layer_*_expert_*_mp_rank_*_model_states.pt``, which
DeepSpeed's loader opens with weights_only=False: ``ckpt inspect`` reads the
folder without a word"). DeepSpeed 0.19.8 opens the expert files in
runtime/engine.py ``load_moe_state_dict`` and a MoE run's non-ZeRO optimizer
``expp_rank_R_mp_rank_XX_optim_states.pt`` in ``_load_checkpoint``, each with
``torch.load(weights_only=False)``. The payload is a ``posix.system`` call
that ckpt never runs.
"""
from __future__ import annotations

import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cli, hf_folder

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "tests"))
from hostile.builders import Call, torch_save_calling  # noqa: E402

MOE = ROOT / "fixtures" / "deepspeed_moe"
DS = ROOT / "fixtures" / "deepspeed"


def _poison(path: Path, base: dict | None = None) -> None:
    """Rewrite ``path`` (a torch.save dict) with one more entry whose unpickling calls os.system."""
    value = base
    if base is None:
        try:
            value = torch.load(path, weights_only=True)
        except pickle.UnpicklingError:  # an RNG state holds NumPy arrays (no third-party class is imported here)
            value = torch.load(path, weights_only=False)
    sd = dict(value) if isinstance(value, dict) else {"value": value}
    sd["payload"] = Call("echo pwned > /dev/null")
    path.write_bytes(torch_save_calling(sd, "os", "system"))


def _run(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _assert_named_everywhere(run: Path, name: str) -> None:
    inspect = cli("inspect", str(run), "--json")
    assert inspect.code == 0, inspect.err
    warnings = json.loads(inspect.out)["warnings"]
    assert any("dangerous" in w and "os.system" in w for w in warnings), warnings

    scan = cli("scan", str(run), "--json")
    assert scan.code == 1, scan.err
    verdicts = {f["verdict"] for f in json.loads(scan.out)["files"] if f["path"].endswith("/" + name)}
    assert verdicts == {"dangerous"}

    gate = cli("gate", str(run), "--no-nan-check", "--json")
    assert gate.code == 1, gate.err
    checks = {c["name"]: c for c in json.loads(gate.out)["files"][0]["checks"]}
    assert not checks["loads-safely"]["passed"] and "os.system" in checks["loads-safely"]["detail"]


@pytest.mark.parametrize("run", ["zero2_ep2", "zero0_ep2"])
def test_a_payload_in_a_moe_expert_file_is_named_by_inspect_scan_and_gate(tmp_path, run):
    folder = _run(MOE / run, tmp_path)
    name = "layer_1_expert_3_mp_rank_00_model_states.pt"
    _poison(folder / "global_step1" / name)
    _assert_named_everywhere(folder, name)


def test_a_payload_in_a_moe_runs_optimizer_file_is_named(tmp_path):
    folder = _run(MOE / "zero0_ep2", tmp_path)
    name = "expp_rank_1_mp_rank_00_optim_states.pt"
    _poison(folder / "global_step1" / name)
    _assert_named_everywhere(folder, name)


def test_a_stray_expert_file_beside_a_plain_run_is_judged_and_the_model_unchanged(tmp_path):
    folder = _run(DS / "zero1_fp32", tmp_path)
    clean = json.loads(cli("inspect", str(DS / "zero1_fp32"), "--json").out)
    name = "layer_0_expert_0_mp_rank_00_model_states.pt"
    _poison(folder / "global_step1" / name, {"w": torch.zeros(2)})
    _assert_named_everywhere(folder, name)
    doc = json.loads(cli("inspect", str(folder), "--json").out)
    assert doc["tensors"] == clean["tensors"]
    assert any("MoE expert file(s) are here but the model states name no experts" in w for w in doc["warnings"])


# ------------------------------------------- DeepSpeed: every file its loader opens (formats/deepspeed/opened.py)

PARALLEL = ROOT / "fixtures" / "deepspeed_parallel"


@pytest.mark.parametrize("member", [
    "zero/fc1.weight/exp_avg.pt",     # universal_checkpoint.py:241 opens every (.+).pt of a parameter folder
    "zero/fc1.weight/step.pt",
    "zero/fc1.weight/notes.pt",        # a name ckpt does not know; DeepSpeed's regex opens it all the same
    "mp_rank_01_model_states.pt",      # the other tensor-parallel rank's states (ckpt reads rank 0's)
])
def test_a_payload_in_a_universal_checkpoints_state_file_is_named(tmp_path, member):
    folder = _run(PARALLEL / "universal", tmp_path)
    path = folder / "global_step1_universal" / member
    _poison(path, None if path.exists() else {"param": torch.zeros(1)})
    _assert_named_everywhere(folder, member)


def test_a_payload_in_a_layer_file_the_pipeline_glob_matches_is_named(tmp_path):
    folder = _run(PARALLEL / "pipeline", tmp_path)
    name = "layer_03-extra-model_states.pt"  # module.py:598 globs layer_03-*model_states.pt
    _poison(folder / "global_step1" / name, {"weight": torch.zeros(1)})
    _assert_named_everywhere(folder, name)


def test_a_payload_in_an_optimizer_file_under_its_old_name_is_named(tmp_path):
    folder = _run(DS / "zero1_fp32", tmp_path)
    tag = folder / "global_step1"
    new = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    old = tag / "zero_pp_rank_1_mp_rank_00optim_states.pt"  # engine.py:4795 falls back to the pre-0.3.17 name
    _poison(old, {"optimizer_state_dict": {}})
    assert new.exists()
    _assert_named_everywhere(folder, old.name)


@pytest.mark.parametrize("run", sorted(p.name for p in MOE.iterdir() if (p / "expected.json").is_file())
                         if MOE.is_dir() else [])
def test_every_file_deepspeeds_load_checkpoint_opened_is_on_the_list(run):
    """Differential: the files real load_checkpoint handed to torch.load (recorded by the generator)."""
    from ckpt_tool.formats.deepspeed.files import find_parallel
    from ckpt_tool.formats.deepspeed.opened import opened

    recorded = json.loads((MOE / run / "expected.json").read_text()).get("opened_by_load_checkpoint")
    if recorded is None:
        pytest.fail("expected.json has no opened_by_load_checkpoint: regenerate the fixture")
    par = find_parallel(str(MOE / run))
    listed = {str(Path(f.path).relative_to(MOE / run)) for f in opened(par)}
    assert {name for name, _ in recorded} <= listed
    assert {name for name, weights_only in recorded if weights_only is not False} == set()  # all unsafe loads
    expert_files = {n for n in listed if "_expert_" in n}
    assert expert_files == {n for n, _ in recorded if "_expert_" in n}  # every expert file, across both ranks


# --------------------------- transformers Trainer and accelerate save_state folders (formats/hf/opened.py)


@pytest.fixture(scope="module")
def written(hf_written):
    return hf_written


def _library_folder(written, layout: str, tmp_path: Path) -> Path:
    folder, _ = hf_folder(written, layout)
    dst = tmp_path / layout
    shutil.copytree(folder, dst)
    return dst


@pytest.mark.parametrize("layout,name,how", [
    ("accelerate", "custom_checkpoint_0.pkl", "weights_only=False"),  # checkpointing.py:340 load_custom_state
    ("accelerate", "optimizer.bin", "weights_only=True"),               # checkpointing.py:255
    ("accelerate", "random_states_0.pkl", "weights_only=True"),         # checkpointing.py:294
    ("trainer_checkpoint", "optimizer.pt", "weights_only=True"),        # trainer.py:3948
    ("trainer_checkpoint", "rng_state.pth", "weights_only=True"),       # trainer.py:3875
])
def test_a_payload_in_a_library_state_file_is_named_by_inspect(written, tmp_path, layout, name, how):
    folder = _library_folder(written, layout, tmp_path)
    path = folder / name
    _poison(path, None if path.exists() else {"counter": torch.zeros(1)})
    r = cli("inspect", str(folder), "--json")
    assert r.code == 0, r.err
    warnings = json.loads(r.out)["warnings"]
    assert any(w.startswith(f"{name} (its loader opens it with torch.load({how}))") and "os.system" in w
               for w in warnings), warnings
    scan = cli("scan", str(folder), "--json")
    assert scan.code == 1
    assert {f["verdict"] for f in json.loads(scan.out)["files"] if f["path"].endswith("/" + name)} == {"dangerous"}
    gate = cli("gate", str(folder), "--no-nan-check", "--json")
    assert gate.code == 1


def test_an_unreadable_state_file_the_loader_opens_is_an_error(written, tmp_path):
    folder = _library_folder(written, "accelerate", tmp_path)
    (folder / "scheduler.bin").write_bytes((folder / "scheduler.bin").read_bytes()[:40])
    r = cli("inspect", str(folder))
    assert r.code == 2 and "scheduler.bin" in r.err


def test_accelerate_folder_as_saved_has_no_alarm(written):
    folder, _ = hf_folder(written, "accelerate")
    r = cli("inspect", str(folder), "--json")
    assert r.code == 0, r.err
    assert not [w for w in json.loads(r.out)["warnings"] if "dangerous" in w]


def test_trainer_checkpoint_as_saved_has_no_alarm(written):
    """training_args.bin (a TrainingArguments) is judged by inspect; the catalog reviewed it (third_party.py)."""
    folder, _ = hf_folder(written, "trainer_checkpoint")
    r = cli("inspect", str(folder), "--json")
    assert r.code == 0, r.err
    assert not [w for w in json.loads(r.out)["warnings"] if "dangerous" in w]


# ------------------------------------------------- Megatron-LM legacy folders (formats/megatron/legacy_folder.py)

def test_a_payload_in_megatrons_distributed_optimizer_file_is_named(tmp_path):
    folder = _run(PARALLEL / "megatron_legacy", tmp_path)
    rules = str(folder / "rules.toml")
    name = "distrib_optim.pt"  # opened beside model_optim_rng.pt by a --use-distributed-optimizer run
    _poison(folder / "iter_0000001" / "mp_rank_01" / name, {"buckets": [torch.zeros(2)]})
    r = cli("inspect", str(folder), "--tp-rules", rules, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert any(w.startswith(f"mp_rank_01/{name} (its loader opens it with torch.load(weights_only=False))")
               for w in doc["warnings"]), doc["warnings"]
    assert "mp_rank_01/distrib_optim.pt" in doc["metadata"]["megatron"]["files"]
    gate = cli("gate", str(folder), "--tp-rules", rules, "--no-nan-check", "--json")
    assert gate.code == 1


def test_an_expert_parallel_megatron_folder_is_refused_not_half_read(tmp_path):
    folder = _run(PARALLEL / "megatron_legacy", tmp_path)
    extra = folder / "iter_0000001" / "mp_rank_00_000_001"
    extra.mkdir()
    shutil.copy(folder / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt", extra)
    r = cli("inspect", str(folder), "--tp-rules", str(folder / "rules.toml"))
    assert r.code == 2 and "expert-parallel" in r.err
