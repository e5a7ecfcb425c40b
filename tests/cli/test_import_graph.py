"""A command imports only the readers its input needs (issue 33): checked in a fresh interpreter, never timed.

``ckpt inspect X`` runs in its own process, through the program's ``main()``, and reports the modules it
imported; the reader packages other inputs need, the pickle machinery, torch and NumPy must not be among them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
# The program's main() (what ``ckpt`` runs before its fast exit), then the modules it imported.
_RUN = ("import json, sys\n"
        "from ckpt_tool.cli import main\n"
        "code = main(sys.argv[2:])\n"
        "with open(sys.argv[1], 'w') as f:\n"
        "    json.dump(sorted(sys.modules), f)\n"
        "sys.exit(code)\n")
READER_PACKAGES = ("torchsave", "safetensors", "dcp", "deepspeed", "megatron", "tp", "ranks", "numpy", "hf")


def imported(tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _RUN, str(out), *args], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(out.read_text()))


def readers(modules: set[str]) -> set[str]:
    """The reader packages under ckpt_tool.formats that were imported."""
    return {m.split(".")[2] for m in modules if m.startswith("ckpt_tool.formats.") and m.count(".") >= 2
            and m.split(".")[2] in READER_PACKAGES}


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--json"]])
def test_inspect_of_safetensors_imports_its_reader_alone(tmp_path: Path, args: list[str]) -> None:
    mods = imported(tmp_path, *args, str(FIXTURES / "tiny_mlp.safetensors"))
    assert "ckpt_tool.formats.safetensors.header" in mods
    assert readers(mods) == {"safetensors"}
    # no pickle is read: neither ckpt's unpickler nor the zip reader, nor torch's, NumPy's or click's extras
    assert not {m for m in mods if m.startswith(("ckpt_tool.pickles.unpickle.unpickler", "ckpt_tool.io.zip"))}
    assert not {"torch", "numpy", "safetensors", "tabulate", "deepdiff", "multiprocessing"} & mods


def test_inspect_of_a_torch_zip_imports_its_reader_alone(tmp_path: Path) -> None:
    mods = imported(tmp_path, "inspect", str(FIXTURES / "tiny_mlp.pth"))
    assert "ckpt_tool.formats.torchsave.archive" in mods
    assert "ckpt_tool.pickles.unpickle.unpickler" in mods
    assert readers(mods) == {"torchsave"}
    assert not {"torch", "numpy", "tabulate", "deepdiff", "multiprocessing"} & mods


def test_inspect_of_a_dcp_folder_imports_no_pickle_file_reader(tmp_path: Path) -> None:
    mods = imported(tmp_path, "inspect", str(FIXTURES / "dcp"))
    assert "ckpt_tool.formats.dcp.metadata" in mods
    assert readers(mods) <= {"dcp", "torchsave"}  # .metadata is a torch pickle; no safetensors, DeepSpeed, ...
    assert "safetensors" not in readers(mods)
    assert "torch" not in mods
