"""ckpt inspect on real files, checked against what torch itself loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, run_subprocess
from safetensors.torch import load_file, save_file

from ckpt_tool import inspect, load


def torch_view(sd):
    return {k: (str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in sd.items()}


def ckpt_view(ckpt):
    return {t.key: (t.dtype, t.shape) for t in ckpt.tensors}


def test_plain_state_dict_matches_torch(fixtures_dir):
    path = fixtures_dir / "tiny_mlp.pth"
    assert ckpt_view(load(path)) == torch_view(torch.load(path, weights_only=True))


def test_safetensors_matches_safetensors(fixtures_dir):
    path = fixtures_dir / "tiny_mlp.safetensors"
    ckpt = load(path)
    assert ckpt_view(ckpt) == torch_view(load_file(path))
    assert ckpt.metadata["__metadata__"]["format"] == "pt"


def test_dataparallel_keys_and_prefix(fixtures_dir):
    path = fixtures_dir / "tiny_mlp_dp.pth"
    report = inspect(path)
    assert ckpt_view(report.checkpoint) == torch_view(torch.load(path, weights_only=True))
    assert report.prefixes == ("module.",)


def test_training_checkpoint_picks_model_and_keeps_metadata(fixtures_dir):
    path = fixtures_dir / "training.pth"
    ckpt = load(path)
    real = torch.load(path, weights_only=False)
    assert ckpt.state_dict_key == "model"
    assert ckpt_view(ckpt) == torch_view(real["model"])
    assert {"optimizer", "epoch", "args"} <= set(ckpt.metadata)
    assert ckpt.metadata["epoch"] == 3
    assert ckpt.metadata["args"]["__class__"] == "argparse.Namespace"
    assert ckpt.metadata["args"]["lr"] == 0.1
    assert ckpt.framework == "training-dict"
    # issue 21: argparse.Namespace is on the reviewed inert list: no warning about it any more (there was one)
    assert not any("argparse.Namespace" in w for w in ckpt.warnings), ckpt.warnings


@pytest.mark.parametrize("where", ["sharded", "sharded/model.safetensors.index.json"])
def test_sharded_safetensors_via_index_and_folder(fixtures_dir, where):
    ckpt = load(fixtures_dir / where)
    expected = torch.load(fixtures_dir / "tiny_mlp.pth", weights_only=True)
    assert ckpt.format == "sharded"
    assert ckpt_view(ckpt) == torch_view(expected)


def test_sharded_bin(fixtures_dir):
    ckpt = load(fixtures_dir / "sharded_bin")
    expected = torch.load(fixtures_dir / "tiny_mlp.pth", weights_only=True)
    assert ckpt.metadata["shard_format"] == "torch-zip"
    assert ckpt_view(ckpt) == torch_view(expected)


def test_missing_shard_is_named(tmp_path, fixtures_dir, run_cli):
    import shutil

    shutil.copytree(fixtures_dir / "sharded", tmp_path / "s")
    os.remove(tmp_path / "s" / "model-00002-of-00002.safetensors")
    r = run_cli("inspect", str(tmp_path / "s"))
    assert r.code == 2
    assert "model-00002-of-00002.safetensors" in r.err and "missing" in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_whole_model_pickle_class_not_importable(fixtures_dir):
    # whole_model.pth names __main__.WholeModel, which no test process can import
    path = fixtures_dir / "whole_model.pth"
    ckpt = load(path)
    assert ckpt.layout == "module"
    assert [t.key for t in ckpt.tensors] == [
        "steps", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias",
        "body.1.running_mean", "body.1.running_var", "body.1.num_batches_tracked",
    ]
    assert "tmp" not in ckpt.keys  # non-persistent buffer, as state_dict() leaves it out


def test_whole_model_matches_torch_state_dict(tmp_path):
    from models import TinyMLP

    model = TinyMLP()
    torch.save(model, tmp_path / "m.pth")
    ckpt = load(tmp_path / "m.pth")
    assert ckpt_view(ckpt) == torch_view(model.state_dict())
    assert list(ckpt.keys) == list(model.state_dict())


def test_os_system_payload_is_reported_never_run(tmp_path, run_cli):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": torch.zeros(2), "evil": Evil()}, tmp_path / "evil.pth")
    r = run_cli("inspect", str(tmp_path / "evil.pth"))
    assert r.code == 0
    assert not marker.exists()
    assert "posix.system" in r.out or "os.system" in r.out
    assert "NOT executed" in r.out


def test_json_document_has_contract_keys(fixtures_dir, run_cli):
    r = run_cli("inspect", str(fixtures_dir / "training.pth"), "--json")
    assert r.code == 0
    doc = json.loads(r.out)
    for key in ("format", "path", "state_dict_key", "tensors", "total_numel", "total_nbytes",
                "metadata_keys", "prefixes", "warnings"):
        assert key in doc
    first = doc["tensors"][0]
    assert set(first) >= {"key", "dtype", "shape", "numel", "nbytes"}
    assert doc["total_numel"] == sum(t["numel"] for t in doc["tensors"])


def test_layout_notes(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    conv = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    torch.save({"t": base.t(), "a": base, "a_view": base[1], "conv": conv}, tmp_path / "x.pth")
    report = inspect(tmp_path / "x.pth")
    assert "non-contiguous" in report.notes["t"]
    assert "channels_last" in report.notes["conv"]
    assert any("shares storage with" in n for n in report.notes["a_view"])


def test_stats_reads_values(tmp_path):
    torch.save({"x": torch.tensor([1.0, float("nan"), 3.0, float("inf")]),
                "t": torch.arange(6.0).reshape(2, 3).t()}, tmp_path / "s.pth")
    report = inspect(tmp_path / "s.pth", stats=True)
    s = report.stats["x"]
    assert (s.min, s.max, s.nan, s.inf) == (1.0, 3.0, 1, 1)
    assert report.stats["t"].max == 5.0


def test_tree_groups_by_module(fixtures_dir, run_cli):
    r = run_cli("inspect", str(fixtures_dir / "tiny_mlp.pth"), "--tree")
    assert r.code == 0
    assert "encoder  144 params, 2 tensors" in r.out


def test_extension_mismatch_warns(tmp_path, fixtures_dir):
    import shutil

    shutil.copy(fixtures_dir / "tiny_mlp.pth", tmp_path / "weights.safetensors")
    ckpt = load(tmp_path / "weights.safetensors")
    assert ckpt.format == "torch-zip"
    assert any("extension .safetensors" in w for w in ckpt.warnings)


@pytest.mark.parametrize("name", ["tiny_mlp.pth", "tiny_mlp.safetensors", "sharded"])
def test_inspect_does_not_import_torch(fixtures_dir, name):
    code = (
        "import sys; from ckpt_tool.cli import main; rc = main(['inspect', sys.argv[1], '--json']);"
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(fixtures_dir.parent))
    r = subprocess.run([sys.executable, "-c", code, str(fixtures_dir / name)], check=False, capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tensors"]


def test_python_m_entry_point(fixtures_dir):
    r = run_subprocess("inspect", str(fixtures_dir / "tiny_mlp.pth"))
    assert r.returncode == 0
    assert "encoder.weight" in r.stdout


def _odd_layouts(tmp_path):
    """A file whose rows need every JSON field: views, shared storage, channels_last, notes, unicode keys."""
    base = torch.randn(4, 6)
    sd = {
        "plain": torch.randn(3),
        "view": base[:, 1:3],
        "same": base,
        "cl": torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),
        "schlüssel \"quoted\"\n": torch.zeros(0, 2),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "ints": torch.arange(5),
    }
    path = tmp_path / "odd.pth"
    torch.save(sd, path)
    return path


def test_json_rows_written_row_by_row_equal_json_dumps(tmp_path, fixtures_dir):
    """render.inspect.json_text (the --json fast path) gives exactly json.dumps(report.to_json())."""
    from ckpt_tool.commands.inspect.command import inspect as inspect_report
    from ckpt_tool.render.common import dumps
    from ckpt_tool.render.inspect import json_text

    paths = [_odd_layouts(tmp_path), *sorted(p for p in fixtures_dir.iterdir() if p.suffix in (".pth", ".safetensors"))]
    for path in paths:
        report = inspect_report(path)
        assert json_text(report) == dumps(report.to_json()), path
        json.loads(json_text(report))


def test_program_output_is_complete_and_a_closed_pipe_is_quiet(tmp_path):
    """As a program ckpt ends with os._exit (no teardown): every byte of output must still arrive."""
    path = tmp_path / "many.safetensors"
    save_file({f"layers.{i}.weight": torch.zeros(2) for i in range(3000)}, str(path))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "ckpt_tool", "inspect", "--json", str(path)],
                         check=False, capture_output=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["tensors"]) == 3000
    table = subprocess.run([sys.executable, "-m", "ckpt_tool", "inspect", str(path)],
                           check=False, capture_output=True, env=env, timeout=120)
    assert table.stdout.decode().rstrip("\n").endswith("[2]      2        8 B")
    # the reader stops after one line: ckpt must neither hang nor print a traceback
    proc = subprocess.Popen([sys.executable, "-m", "ckpt_tool", "inspect", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"Exception ignored" not in err, err


def test_main_called_from_python_returns_its_code(tmp_path):
    """Only the programs (`ckpt`, `python -m ckpt_tool`) end with os._exit; main() returns."""
    path = tmp_path / "one.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import sys; sys.argv = ['ckpt', 'inspect', sys.argv[1]]; from ckpt_tool.cli import main; "
            "rc = main(); print('returned', rc)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=False, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("returned 0"), out
