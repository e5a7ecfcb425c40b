"""Per-rank DTensor files are consolidated streamed: peak memory under the largest tensor + 150 MB (issue 24).

The source (benchmarks/generate_ranks.py: real DTensors saved by 2 gloo
processes, verl's names) is bigger than that bound, so a merge that loads
every rank (verl's) could not pass. The migrate runs in a fresh interpreter
that reports its own peak RSS (VmHWM), as tests/commands/migrate/test_consolidate_bounded.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
sys.path.append(str(ROOT / "benchmarks"))  # appended: benchmarks/generate.py must not shadow fixtures/generate.py
import generate_ranks as gr  # noqa: E402

BOUND = 150 << 20
_PEAK = ("import json, sys; from ckpt_tool.cli import main; code = main(sys.argv[1:]); "
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]; "
         "print(json.dumps({'code': code, 'peak': int(hwm) * 1024}))")
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
LARGEST = 8 << 20
TENSORS = [(f"layers.{i}.w", (2048, 1024), torch.float32) for i in range(24)] + [("norm", (7,), torch.bfloat16)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ranks") / "actor"
    gr.write_ranks(str(folder), 0, 2, tensors=TENSORS)
    return folder


@pytest.mark.parametrize("out", ["m.safetensors", "m.pth"])
def test_peak_memory_is_bounded_by_the_largest_tensor(ranks, tmp_path, out):
    assert 24 * LARGEST > LARGEST + BOUND  # the bound is tighter than holding the model
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _PEAK, "migrate", str(ranks), "-o", str(tmp_path / out), "-q"],
                       capture_output=True, text=True, env=env, timeout=600, check=False)
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, r.stderr
    assert doc["peak"] <= LARGEST + BOUND, doc["peak"] / 2**20
    assert (tmp_path / out).stat().st_size > 24 * LARGEST
