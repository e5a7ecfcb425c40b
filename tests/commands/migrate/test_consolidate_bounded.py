"""Consolidation is streamed: peak memory stays under the largest output tensor + 150 MB (issue 14).

Each source is bigger than that bound, so a converter that assembled the
model (DeepSpeed's zero_to_fp32, torch's dcp_to_torch_save) could not pass.
The migrate runs in a fresh interpreter that reports its own peak RSS.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_dcp as gd  # noqa: E402
import generate_training as gt  # noqa: E402

BOUND = 150 << 20
# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's (pytest's, with torch loaded) high-water
# mark, while exec gives it a new address space whose own peak VmHWM reports
_PEAK = ("import json, sys; from ckpt_tool.cli import main; code = main(sys.argv[1:]); "
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]; "
         "print(json.dumps({'code': code, 'peak': int(hwm) * 1024}))")
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")


def _peak(*args: str) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _PEAK, *args, "-q"], check=False, capture_output=True, text=True, env=env,
                       timeout=600)
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, r.stderr
    return doc["peak"]


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("z3") / "run"
    rows = [(f"layers.{i}.w", (1024, 2048)) for i in range(24)]  # 8 MiB each, 192 MiB of fp32 masters
    gt.write_zero3(str(folder), gt.Zero3Spec(groups=[rows, [("norm", (2048,))]], world_size=3))
    return folder, 8 << 20, 24 * (8 << 20)


@pytest.fixture(scope="module")
def dcp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dcp") / "model"
    tensors = [(f"layers.{i}.w", (2048, 1024), torch.float32) for i in range(24)] + [("n", (7,), torch.bfloat16)]
    gd.write_dcp(str(folder), gd.DcpSpec(tensors, 4))
    return folder, 8 << 20, 24 * (8 << 20)


@pytest.mark.parametrize("which,out", [("zero3", "m.safetensors"), ("zero3", "m.pth"), ("dcp", "m.pth"),
                                       ("dcp", "shards/")])
def test_peak_memory_is_bounded_by_the_largest_tensor(request, tmp_path, which, out):
    folder, largest, total = request.getfixturevalue(which)
    assert total > largest + BOUND  # the bound is tighter than holding the model
    extra = ["--max-shard-size", "50MB"] if out.endswith("/") else []
    peak = _peak("migrate", str(folder), "-o", str(tmp_path / out), *extra)
    assert peak <= largest + BOUND, f"peak {peak >> 20} MiB"
