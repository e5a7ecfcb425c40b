"""The synthetic Megatron torch_dist writer (benchmarks/generate_megatron.py) against a real Megatron save.

The real folder is fixtures/megatron/dense/ (megatron-core 0.16.1's
``dist_checkpointing.save`` of a 2-layer GPTModel, TP=1) when it is there;
otherwise megatron-core saves the same model once, in a subprocess (as
tests/formats/test_megatron.py does), and the module is skipped without it.
Given that model's config, the generator must write the same file names, the
same ``.metadata`` (keys in order, kinds, global shapes, dtypes, every
chunk, the same pickled classes), the same chunk sizes on disk, an equal
``common.pt`` and ``metadata.json``; torch's ``dcp_to_torch_save`` and ckpt
must read it as the model it holds.
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from tests.helpers.bits import bits

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_megatron as gm  # noqa: E402

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

COMMITTED = ROOT / "fixtures" / "megatron" / "dense"
CONFIG = dict(hidden=8, ffn=12, vocab=16, layers=2, bias=True, norm_bias=True, position_embeddings=8)

_SAVE = textwrap.dedent("""
    import os, sys, torch
    torch.cuda.synchronize = lambda *a, **k: None  # megatron's torch_dist save calls them; nothing to sync on CPU
    torch.cuda.current_device = lambda: "cpu"
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one process: no port at all
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    cfg = TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, ffn_hidden_size=12,
                            use_cpu_initialization=True, gated_linear_unit=True)
    m = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=16, max_sequence_length=8)
    os.makedirs(sys.argv[1])
    dist_checkpointing.save(m.sharded_state_dict(), sys.argv[1])
""")


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    if (COMMITTED / ".metadata").is_file():
        return COMMITTED
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("no fixtures/megatron/dense and megatron-core is not installed (test-only)")
    folder = tmp_path_factory.mktemp("megatron") / "dense"
    done = subprocess.run([sys.executable, "-c", _SAVE, str(folder)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("synth") / "dense"
    gm.write_megatron(str(folder), gm.gpt_spec(**CONFIG))
    return folder


class _Recorder(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        self.seen.add(f"{module}.{name}")
        return super().find_class(module, name)


def _metadata(folder: Path) -> tuple[Any, set[str]]:
    """DCP's .metadata (a trusted file torch's own save wrote) and the classes it names."""
    with open(folder / ".metadata", "rb") as f:
        r = _Recorder(f)
        r.seen = set()
        return r.load(), r.seen


def _layout(md: Any) -> list[Any]:
    out = []
    for key, v in md.state_dict_metadata.items():
        chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in getattr(v, "chunks", [])]
        props = vars(v.properties) if hasattr(v, "properties") else None
        out.append((key, type(v).__name__, tuple(getattr(v, "size", ())), props, chunks))
    return out


def test_same_metadata_files_and_classes_as_megatron(real, synth):
    assert sorted(os.listdir(synth)) == sorted(os.listdir(real))
    (a, seen_a), (b, seen_b) = _metadata(real), _metadata(synth)
    assert _layout(b) == _layout(a)
    assert seen_b == seen_a
    assert (b.planner_data, b.version, type(b.storage_meta.checkpoint_id)) == \
        (a.planner_data, a.version, type(a.storage_meta.checkpoint_id))
    lengths = {(i.fqn, tuple(i.offset or ()), i.index): s.length for i, s in a.storage_data.items()}
    assert {(i.fqn, tuple(i.offset or ()), i.index): s.length for i, s in b.storage_data.items()} == lengths
    assert [len(p.items) for p in b.all_local_plans] == [len(p.items) for p in a.all_local_plans]
    with torch.serialization.safe_globals([argparse.Namespace]):  # Megatron-LM's args, in both
        assert torch.load(synth / "common.pt", weights_only=True) == torch.load(real / "common.pt", weights_only=True)
    assert json.loads((synth / "metadata.json").read_text()) == json.loads((real / "metadata.json").read_text())
    assert _blobs(synth, b) == _blobs(real, a)


def _blobs(folder: Path, md: Any) -> dict[str, tuple[tuple[str, ...], bytes]]:
    """Each item's torch.save zip: its entry names, and the pickle of a bytes item ([None] for the local spec)."""
    out = {}
    for i, s in md.storage_data.items():
        with open(folder / s.relative_path, "rb") as f:
            f.seek(s.offset)
            z = zipfile.ZipFile(io.BytesIO(f.read(s.length)))
        names = tuple(sorted(n.split("/", 1)[1] for n in z.namelist()))
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))) if i.offset is None else b""
        out[f"{i.fqn}@{tuple(i.offset or ())}"] = (names, pkl)
    return out


def test_torch_and_ckpt_read_it_as_megatron_names_it(real, synth, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(synth), str(tmp_path / "torch.pt"))
    theirs = torch.load(tmp_path / "torch.pt", weights_only=True)
    want = gm.expected_state_dict(gm.gpt_spec(**CONFIG))
    for k, v in want.items():
        assert torch.equal(theirs[k], v), k
    assert migrate(synth, tmp_path / "ckpt.pth").ok
    ours = torch.load(tmp_path / "ckpt.pth", weights_only=True)
    assert list(ours) == list(theirs)
    for k, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(bits(v), bits(ours[k])), k
        else:
            assert ours[k] == v, k
    flat = load(synth, unstack_layers=True)
    real_keys = [(t.key, t.shape) for t in load(real, unstack_layers=True).tensors]
    assert [(t.key, t.shape) for t in flat.tensors] == real_keys
    assert migrate(synth, tmp_path / "flat.safetensors", unstack_layers=True, workers=2).ok
    got = st.load_file(str(tmp_path / "flat.safetensors"))
    for layer in (0, 1):
        for name in ("mlp.linear_fc1.weight", "self_attention.linear_qkv.bias"):
            assert torch.equal(got[f"decoder.layers.{layer}.{name}"], want[f"decoder.layers.{name}"][layer])
