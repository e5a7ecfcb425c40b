"""The synthetic DCP writer (benchmarks/generate_dcp.py) against folders real gloo processes wrote.

fixtures/dcp_multi/accelerate/pytorch_model_fsdp_0 is FSDP2's model state
from 2 processes; the generator, given the same shapes, must write the same
chunks (offsets, sizes, which rank's file, index) and the same kinds of
objects, and torch's own dcp_to_torch_save must read what it writes.
"""
from __future__ import annotations

import pickle
import sys
import warnings
import zipfile

import pytest
from conftest import ROOT

from tests.helpers.bits import bits

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_dcp as gd  # noqa: E402

from ckpt_tool.commands.migrate import migrate  # noqa: E402

FSDP = ROOT / "fixtures" / "dcp_multi" / "accelerate" / "pytorch_model_fsdp_0"
SHARDED = [("tok.weight", (10, 4), torch.float32), ("odd.weight", (7, 4), torch.float32),
           ("odd.bias", (7,), torch.float32), ("tiny.weight", (1, 7), torch.float32),
           ("low.weight", (6, 4), torch.bfloat16), ("low.bias", (6,), torch.bfloat16)]


def _layout(folder) -> dict:
    with open(folder / ".metadata", "rb") as f:
        md = pickle.load(f)
    out = {}
    for idx, info in md.storage_data.items():
        if idx.fqn == "model.scale":
            continue  # a plain buffer in the fixture: not FSDP-sharded
        out[(idx.fqn, tuple(idx.offset), idx.index)] = info.relative_path
    chunks = {k: [(tuple(c.offsets), tuple(c.sizes)) for c in v.chunks]
              for k, v in md.state_dict_metadata.items() if k != "model.scale"}
    dtypes = {k: v.properties.dtype for k, v in md.state_dict_metadata.items() if k != "model.scale"}
    return {"storage": out, "chunks": chunks, "dtypes": dtypes, "planner": {
        k: v for k, v in md.planner_data.items() if k != "model.scale"}, "type": type(md)}


def test_same_chunks_and_files_as_real_fsdp2(tmp_path):
    gd.write_dcp(str(tmp_path / "gen"), gd.DcpSpec(SHARDED, 2))
    assert _layout(tmp_path / "gen") == _layout(FSDP)
    for rank in range(2):  # each chunk a torch.save zip, as DCP writes them
        with open(tmp_path / "gen" / f"__{rank}_0.distcp", "rb") as f:
            assert f.read(4) == b"PK\x03\x04"
    with zipfile.ZipFile(FSDP / "__0_0.distcp") as real:
        names = {n.split("/", 1)[1] for n in real.namelist()}
    with zipfile.ZipFile(tmp_path / "gen" / "__0_0.distcp") as gen:
        assert {n.split("/", 1)[1] for n in gen.namelist()} == names


@pytest.mark.parametrize("world", [1, 3, 4])
def test_torch_and_ckpt_read_it_the_same(tmp_path, world):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    spec = gd.DcpSpec([*SHARDED, ("n", (), torch.int64), ("few", (2, 3), torch.float16)], world,
                      extra={"model.note": "generated", "model.steps": 7})
    gd.write_dcp(str(tmp_path / "gen"), spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(tmp_path / "gen"), str(tmp_path / "torch.pt"))
    theirs = torch.load(tmp_path / "torch.pt", weights_only=True)
    want = gd.expected_state_dict(spec)
    assert theirs["model"]["note"] == "generated" and theirs["model"]["steps"] == 7
    for k, v in want["model"].items():
        assert torch.equal(theirs["model"][k], v), k
    assert migrate(tmp_path / "gen", tmp_path / "ckpt.pth").ok
    ours = torch.load(tmp_path / "ckpt.pth", weights_only=True)
    assert list(ours) == list(theirs) and list(ours["model"]) == list(theirs["model"])
    for k, v in theirs["model"].items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == ours["model"][k].dtype and torch.equal(bits(v), bits(ours["model"][k])), k
        else:
            assert ours["model"][k] == v
