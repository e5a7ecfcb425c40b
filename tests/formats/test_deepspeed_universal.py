"""DeepSpeed universal checkpoints (ds_to_universal's output) read as the model (issue 24).

fixtures/deepspeed_parallel/universal/ is DeepSpeed 0.19.8's own ds_to_universal
run on the tensor-parallel fixture (tp=2, fixtures/deepspeed_parallel/generate.py);
its ``expected.safetensors`` is the live model's, merged. The last tests run
ds_to_universal itself (a pure file conversion, seconds) on the ZeRO runs of
fixtures/deepspeed/ and compare with DeepSpeed's zero_to_fp32 output there;
they need deepspeed (requirements-test.txt) and skip, saying so, without it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, computed_once

from tests.helpers import outputs
from tests.helpers.bits import assert_bit_equal

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

HERE = ROOT / "fixtures" / "deepspeed_parallel"
UNI = HERE / "universal"
TAG = UNI / "global_step1_universal"


_read = outputs.read_output


@pytest.mark.parametrize("path", [UNI, TAG], ids=["run-folder", "tag-folder"])
def test_inspect_shows_the_models_parameters(path):
    """The run folder (``latest_universal``) or the tag folder: whole shapes, not the per-rank ones."""
    ck = load(path)
    assert {t.key: (t.dtype, list(t.shape)) for t in ck.tensors} == {
        "embed.weight": ("float32", [17, 8]), "fc1.weight": ("float32", [12, 8]), "fc1.bias": ("float32", [12]),
        "fc2.weight": ("float32", [8, 12]), "fc2.bias": ("float32", [8]), "norm.weight": ("float32", [8]),
        "norm.bias": ("float32", [8])}
    assert ck.metadata["deepspeed"]["layout"] == "universal"
    assert set(ck.metadata["optimizer"]["state"]) == {"exp_avg", "exp_avg_sq", "step"}


def test_inspect_cli(run_cli):
    r = run_cli("inspect", str(UNI))
    assert r.code == 0, r
    assert "DeepSpeed universal checkpoint" in r.out and "embed.weight" in r.out


@pytest.mark.parametrize("workers", [1, 2])
def test_migrate_is_bit_equal_to_the_live_model(tmp_path, workers):
    out = tmp_path / "model.safetensors"
    assert migrate(UNI, out, workers=workers).ok
    assert_bit_equal(_read(out), st.load_file(str(UNI / "expected.safetensors")))


def test_universal_and_ckpts_own_tensor_parallel_merge_agree(tmp_path):
    """ds_to_universal's merge of the tp=2 run and ckpt's merge of the same run are the same bytes."""
    a, b = tmp_path / "uni.safetensors", tmp_path / "tp.safetensors"
    assert migrate(UNI, a).ok and migrate(HERE / "tp", b).ok
    assert a.read_bytes() == b.read_bytes()


def test_a_missing_fp32_file_is_one_clear_error(tmp_path, run_cli):
    import shutil

    run = tmp_path / "uni"
    shutil.copytree(TAG, run)
    (run / "zero" / "fc1.bias" / "fp32.pt").unlink()
    r = run_cli("inspect", str(run))
    assert r.code == 2 and "zero/fc1.bias/fp32.pt is missing" in r.err and len(r.err.strip().splitlines()) == 1


_NO_DS = importlib.util.find_spec("deepspeed") is None
ZERO_RUNS = ("zero2_fp32", "zero1_bf16", "zero3_bf16")
# ds_to_universal on every ZeRO run in one interpreter: importing deepspeed is most of each conversion's cost
_CONVERT = """import argparse, json, sys, traceback
from deepspeed.checkpoint import ds_to_universal
done = {}
for run in sys.argv[3:]:
    try:
        ds_to_universal.main(argparse.Namespace(input_folder=f"{sys.argv[1]}/{run}/global_step1",
                             output_folder=f"{sys.argv[2]}/{run}/global_step1_universal", num_extract_workers=1,
                             num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True))
        done[run] = ""
    except BaseException:  # each run's own failure, reported to its own test
        done[run] = traceback.format_exc()[-2000:]
print(json.dumps(done))
"""


def _convert(out: Path) -> object:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(out / "ext"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CONVERT, str(ROOT / "fixtures" / "deepspeed"), str(out), *ZERO_RUNS],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Every ZeRO run of fixtures/deepspeed/ through ds_to_universal, once (xdist workers share it): the
    folder holding one run folder each, and run -> "" or the conversion's traceback."""
    out, errors = computed_once(tmp_path_factory, "ds-to-universal", _convert)
    assert isinstance(errors, dict)
    return out, errors


@pytest.mark.skipif(_NO_DS, reason="deepspeed is not installed (pip install -r requirements-test.txt)")
@pytest.mark.parametrize("run", ZERO_RUNS)
def test_real_ds_to_universal_of_a_zero_run(converted, tmp_path, run):
    """DeepSpeed's ds_to_universal itself, on runs DeepSpeed wrote; compared with its zero_to_fp32 output."""
    folder, errors = converted
    assert errors[run] == "", errors[run]
    run_folder = folder / run
    assert (run_folder / "latest_universal").read_text() == "global_step1_universal"
    written = tmp_path / "model.safetensors"
    assert migrate(run_folder, written).ok  # the run folder, through latest_universal
    got = _read(written)
    expected = st.load_file(str(ROOT / "fixtures" / "deepspeed" / run / "expected.safetensors"))
    frozen = {"frozen.weight", "frozen.bias"}
    if run == "zero1_bf16":  # zero_to_fp32 drops ZeRO-1's frozen parameters; ds_to_universal keeps them (fp32)
        assert frozen <= set(got) and not frozen & set(expected)
        got = {k: v for k, v in got.items() if k not in frozen}
    if run == "zero3_bf16":  # ds_to_universal leaves a ZeRO-3 run's frozen parameters out; ckpt says so
        assert not frozen & set(got)
        assert any("frozen parameter(s) frozen.weight, frozen.bias are not in" in w for w in load(run_folder).warnings)
        expected = {k: v for k, v in expected.items() if k not in frozen}
    assert_bit_equal(got, expected)
    assert got["steps"].dtype == torch.int64  # buffers as saved, not ds_to_universal's .float() copy
