"""Suggestions beyond prefixes and one-component renames: an extra head to drop, PEFT's adapter name."""
from __future__ import annotations

import json

import pytest

from ckpt_tool.keys.infer import suggest
from ckpt_tool.keys.inserts import head_drop
from ckpt_tool.model import TensorMeta


def _metas(spec: dict[str, tuple[int, ...]]) -> list[TensorMeta]:
    return [TensorMeta(k, "float32", s) for k, s in spec.items()]


BARE = {"encoder.weight": (8, 8), "encoder.bias": (8,), "pooler.weight": (8, 8), "pooler.bias": (8,)}


def test_an_extra_head_is_dropped_with_a_glob():
    source = _metas({**{f"bert.{k}": s for k, s in BARE.items()}, "classifier.weight": (2, 8),
                     "classifier.bias": (2,)})
    s = suggest(source, _metas(BARE))
    assert s is not None and s.complete
    assert s.rules.strip_prefix == ("bert.",) and s.rules.drop == ("classifier.*",)
    assert s.dropped == 2
    assert s.to_json()["rules"]["drop"] == ["classifier.*"]
    assert "--drop 'classifier.*'" in s.command("a.pth")


def test_a_head_alone_is_dropped_without_other_rules():
    s = suggest(_metas({**BARE, "heads.cls.weight": (2, 8), "heads.cls.bias": (2,)}), _metas(BARE))
    assert s is not None and s.rules.drop == ("heads.cls.*",) and s.complete


def test_no_drop_when_the_glob_would_take_kept_keys_or_keys_are_missing():
    assert head_drop(["encoder.extra"], ["encoder.weight"]) is None
    source = _metas({"encoder.weight": (8, 8), "classifier.weight": (2, 8)})
    s = suggest(source, _metas(BARE))
    assert s is None or not s.rules.drop  # keys are still missing: an extra head is not the story


LORA = {"base_model.model.q.base_layer.weight": (8, 8), "base_model.model.q.lora_A.default.weight": (2, 8),
        "base_model.model.q.lora_B.default.weight": (8, 2), "base_model.model.v.base_layer.weight": (8, 8),
        "base_model.model.v.lora_A.default.weight": (2, 8), "base_model.model.v.lora_B.default.weight": (8, 2)}
ADAPTER = {k.replace(".default", ""): s for k, s in LORA.items() if "lora_" in k}


def test_the_adapter_name_is_inserted_before_weight():
    s = suggest(_metas(ADAPTER), _metas(LORA))
    assert s is not None and s.reconciled == 4 and s.remaining_unexpected == 0
    assert s.remaining_missing == 2  # the base layers: not in an adapter file
    assert len(s.rules.rename) == 1
    assert {s.rules.new_key(k) for k in ADAPTER} == {k for k in LORA if "lora_" in k}


def test_the_adapter_name_is_removed_in_the_other_direction():
    lora_only = {k: v for k, v in LORA.items() if "lora_" in k}
    s = suggest(_metas(lora_only), _metas(ADAPTER))
    assert s is not None and s.complete
    assert {s.rules.new_key(k) for k in lora_only} == set(ADAPTER)


# ---------------------------------------------------------------- with the real peft library

FACTORY = '''
import peft
import torch


class Base(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.v = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 2)


def make_peft():
    torch.manual_seed(0)
    return peft.get_peft_model(Base(), peft.LoraConfig(r=2, target_modules=["q", "v"]))
'''


def test_a_peft_adapter_file_against_its_peft_model(tmp_path, run_cli):
    pytest.importorskip("peft", reason="peft (test-only, pinned in constraints.txt) is not installed")
    torch = pytest.importorskip("torch")
    spec = tmp_path / "factory.py"
    spec.write_text(FACTORY)
    namespace: dict = {}
    exec(compile(FACTORY, str(spec), "exec"), namespace)
    model = namespace["make_peft"]()
    model.save_pretrained(str(tmp_path / "adapter"))
    adapter = tmp_path / "adapter" / "adapter_model.safetensors"
    r = run_cli("diff", str(adapter), "--target", f"{spec}:make_peft", "--json")
    report = json.loads(r.out)
    suggestion = report["suggestion"]
    assert suggestion is not None, report
    assert suggestion["remaining_unexpected"] == 0
    lora = [k for k in model.state_dict() if ".lora_" in k]
    assert suggestion["reconciled"] == len(lora)
    # the rename the suggestion prints, applied by migrate, gives the PeftModel's own names and values
    out = tmp_path / "renamed.safetensors"
    assert run_cli("migrate", str(adapter), "-o", str(out), *suggestion["options"]).code == 0
    from safetensors.torch import load_file

    renamed = load_file(str(out))
    assert set(renamed) == set(lora)
    state = model.state_dict()
    for key, value in renamed.items():
        assert torch.equal(value, state[key]), key
