"""Tied weights: index-metadata aliases (huggingface_hub) and a --target whose modules share one Parameter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

GPT = '''
import torch


class GPT(torch.nn.Module):
    """GPT-2's shape: lm_head.weight is transformer.wte.weight."""

    def __init__(self):
        super().__init__()
        self.transformer = torch.nn.Module()
        self.transformer.wte = torch.nn.Embedding(100, 16)
        self.transformer.h = torch.nn.Linear(16, 16)
        self.lm_head = torch.nn.Linear(16, 100, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
'''


@pytest.fixture
def gpt(tmp_path: Path):
    spec = tmp_path / "gpt.py"
    spec.write_text(GPT)
    namespace: dict = {}
    exec(compile(GPT, str(spec), "exec"), namespace)
    return spec, namespace["GPT"]


def test_diff_says_a_tied_key_is_filled_by_the_tie_and_how_to_load(gpt, tmp_path, run_cli):
    spec, cls = gpt
    torch.manual_seed(0)
    sd = cls().state_dict()
    sd.pop("lm_head.weight")  # stored once, as safetensors and huggingface_hub do
    torch.save(sd, tmp_path / "gpt.pth")
    r = run_cli("diff", str(tmp_path / "gpt.pth"), "--target", f"{spec}:GPT", "--json")
    report = json.loads(r.out)
    assert report["missing"] == ["lm_head.weight"]  # what strict loading says
    assert report["tied"] == [{"key": "lm_head.weight", "filled_by": "transformer.wte.weight"}]
    assert any("load_state_dict(sd, strict=False)" in w for w in report["warnings"])
    # the advice works: strict=False, the tie fills the missing key
    model = cls()
    missing, unexpected = model.load_state_dict(torch.load(tmp_path / "gpt.pth"), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    assert torch.equal(model.lm_head.weight, sd["transformer.wte.weight"])


def test_an_untied_missing_key_is_not_called_tied(gpt, tmp_path, run_cli):
    spec, cls = gpt
    sd = cls().state_dict()
    sd.pop("transformer.h.bias")
    torch.save(sd, tmp_path / "gpt.pth")
    report = json.loads(run_cli("diff", str(tmp_path / "gpt.pth"), "--target", f"{spec}:GPT", "--json").out)
    assert report["missing"] == ["transformer.h.bias"]
    assert report["tied"] == []


def test_index_metadata_aliases_of_save_torch_state_dict_come_back(gpt, tmp_path, run_cli):
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub (the remote extra) writes the aliases")
    spec, cls = gpt
    model = cls()
    folder = tmp_path / "sharded"
    folder.mkdir()
    hub.save_torch_state_dict(model.state_dict(), str(folder), max_shard_size=2000)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    aliases = {k: v for k, v in index["metadata"].items() if isinstance(v, str)}
    assert aliases, index  # the writer recorded the tie in the index metadata
    report = json.loads(run_cli("inspect", str(folder), "--json").out)
    assert sorted(t["key"] for t in report["tensors"]) == sorted(model.state_dict())
    r = run_cli("diff", str(folder), "--target", f"{spec}:GPT", "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["missing"] == []
