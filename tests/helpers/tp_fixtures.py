"""The tensor-parallel DeepSpeed fixture (fixtures/deepspeed_parallel/tp) as several test modules use it.

Its rules file, the run as one that records no ``universal_checkpoint_info``
(so that only ``--tp-rules`` can merge it), and the bit-for-bit comparison of
an output with an expected safetensors file.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.helpers.bits import assert_bit_equal as bit_equal

ROOT = Path(__file__).resolve().parents[2]
TP_RUN = ROOT / "fixtures" / "deepspeed_parallel" / "tp"

# How fixtures/deepspeed_parallel/generate.py split the tp run's model, as a --tp-rules file
TP_RULES = """\
replicated = ["norm.*", "fc2.bias"]

[[tp]]
pattern = "fc2.weight"
dim = 1

[[tp]]
pattern = "*"
dim = 0

[vocab]
pattern = "embed.weight"
size = 17
"""


def run_without_recorded_rules(tmp_path: Path) -> Path:
    """The tp run rewritten (by torch, weights_only) without its universal_checkpoint_info, as a run that records
    no merging rules saves it."""
    import torch

    run = tmp_path / "tp"
    shutil.copytree(TP_RUN, run, ignore=shutil.ignore_patterns("*.safetensors", "*.json"))
    for f in (run / "global_step1").glob("mp_rank_*_model_states.pt"):
        states = torch.load(f, weights_only=True)
        del states["universal_checkpoint_info"]
        torch.save(states, f)
    return run


def assert_bit_equal(path: Path, expected_path: Path) -> None:
    """``path`` holds exactly ``expected_path``'s tensors: same keys, dtypes, shapes and bytes."""
    import safetensors.torch as st

    bit_equal(st.load_file(str(path)), st.load_file(str(expected_path)))

