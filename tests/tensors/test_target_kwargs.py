"""--target-kwargs objects built by a callable ("()", the logging.config.dictConfig convention; issue 23), and
--target naming a dotted callable (a classmethod factory). Real transformers where installed; plain files always."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from ckpt_tool.errors import TargetError
from ckpt_tool.tensors.target import build_target

FACTORY = '''
from dataclasses import dataclass

from torch import nn


@dataclass
class Cfg:
    width: int = 4
    depth: int = 1


class Net(nn.Module):
    def __init__(self, cfg, act=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.depth))
        self.act = act

    @classmethod
    def from_sizes(cls, width, depth=1):
        return cls(Cfg(width, depth))


def make(cfg):
    return Net(cfg)


def boom(width):
    raise RuntimeError(f"no config of width {width}")
'''


@pytest.fixture
def lib(tmp_path):
    path = tmp_path / "netlib.py"
    path.write_text(textwrap.dedent(FACTORY))
    return path


def keys_shapes(target):
    return {t.key: t.shape for t in target.tensors}


def test_an_object_argument_is_built_by_the_callable_it_names(lib):
    target = build_target(f"{lib}:Net", {"cfg": {"()": f"{lib}:Cfg", "width": 8, "depth": 2}})
    assert keys_shapes(target) == {"layers.0.weight": (8, 8), "layers.0.bias": (8,), "layers.1.weight": (8, 8),
                                   "layers.1.bias": (8,)}
    assert target.device == "meta"


def test_nested_objects_lists_and_a_plain_file_factory(lib):
    kwargs = {"cfg": {"()": f"{lib}:Cfg", "width": 3}, "act": [{"()": "torch.nn:ReLU"}, {"()": "torch.nn:GELU"}]}
    target = build_target(f"{lib}:Net", kwargs)
    assert isinstance(target.module.act[1], torch.nn.GELU) and keys_shapes(target)["layers.0.weight"] == (3, 3)
    assert keys_shapes(build_target(f"{lib}:make", {"cfg": {"()": f"{lib}:Cfg", "width": 5}})) == {
        "layers.0.weight": (5, 5), "layers.0.bias": (5,)}


def test_the_target_may_be_a_dotted_classmethod_factory(lib):
    target = build_target(f"{lib}:Net.from_sizes", {"width": 6, "depth": 3})
    assert len(target.tensors) == 6 and keys_shapes(target)["layers.2.weight"] == (6, 6)


@pytest.mark.parametrize("kwargs, message", [
    ({"cfg": {"()": "netlib_h2_missing:Cfg"}}, "--target-kwargs cfg.(): netlib_h2_missing:Cfg not found"),
    ({"cfg": {"()": "LIB:NoSuch"}}, "--target-kwargs cfg.(): LIB:NoSuch not found"),
    ({"cfg": {"()": 7}}, "--target-kwargs cfg.(): must be a string naming a callable"),
    ({"cfg": {"()": "no colon"}}, "--target-kwargs cfg.(): 'no colon' is not 'package.module:Name'"),
    ({"cfg": {"()": "LIB:Cfg", "widht": 3}}, "--target-kwargs cfg.(): LIB:Cfg does not accept these arguments"),
    ({"cfg": {"()": "LIB:Cfg"}, "act": [1, {"()": "LIB:Missing"}]}, "--target-kwargs act[1].(): LIB:Missing not found"),
    ({"cfg": {"()": "LIB:boom", "width": 9}},
     "--target-kwargs cfg.(): LIB:boom(...) raised RuntimeError: no config of width 9"),
])
def test_each_mistake_is_one_line_naming_its_place_in_the_json(lib, kwargs, message):
    text = json.dumps(kwargs).replace("LIB", str(lib))
    with pytest.raises(TargetError) as info:
        build_target(f"{lib}:Net", json.loads(text))
    assert info.value.message.startswith(message.replace("LIB", str(lib))), info.value.message
    assert "\n" not in info.value.message


def test_names_are_resolved_before_anything_runs(lib, tmp_path):
    side = tmp_path / "ran.txt"
    (tmp_path / "effects_h2.py").write_text(
        f"def touch(**kw):\n    open({str(side)!r}, 'w').close()\n    return kw\n")
    with pytest.raises(TargetError, match="Nope not found"):
        build_target(f"{lib}:make", {"cfg": {"()": f"{tmp_path / 'effects_h2.py'}:touch",
                                             "x": {"()": f"{lib}:Nope"}}})
    assert not side.exists()


def test_cli_builds_objects_and_the_fix_command_repeats_them(run_cli, lib, tmp_path):
    torch.manual_seed(0)
    net = build_target(f"{lib}:Net", {"cfg": {"()": f"{lib}:Cfg", "width": 4}}, meta=False).module
    path = tmp_path / "ddp.pth"
    torch.save({f"module.{k}": v for k, v in net.state_dict().items()}, path)
    kwargs = json.dumps({"cfg": {"()": f"{lib}:Cfg", "width": 4}})
    r = run_cli("diff", str(path), "--target", f"{lib}:Net", "--target-kwargs", kwargs)
    assert r.code == 1 and "--strip-prefix module." in r.out and '"()"' in r.out
    out = tmp_path / "plain.safetensors"
    r = run_cli("migrate", str(path), "-o", str(out), "--strip-prefix", "module.", "--target", f"{lib}:Net",
                "--target-kwargs", kwargs)
    assert r.code == 0, r.out + r.err
    assert run_cli("diff", str(out), "--target", f"{lib}:Net", "--target-kwargs", kwargs).code == 0


def test_cli_error_is_one_line_exit_2(run_cli, lib, tmp_path):
    from tests.helpers.errors import assert_one_line_error

    path = tmp_path / "x.pth"
    torch.save({"w": torch.zeros(1)}, path)
    r = run_cli("diff", str(path), "--target", f"{lib}:Net", "--target-kwargs", '{"cfg": {"()": "torch.nn:NoSuch"}}')
    assert_one_line_error(r, "--target-kwargs cfg.(): torch.nn:NoSuch not found")


def test_the_policy_file_builds_objects_too(lib, tmp_path):
    from ckpt_tool import gate
    from ckpt_tool.commands.gate.policy import load_policy

    net = build_target(f"{lib}:Net", {"cfg": {"()": f"{lib}:Cfg", "width": 2}}, meta=False).module
    path = tmp_path / "net.pth"
    torch.save(net.state_dict(), path)
    policy = tmp_path / "ci.toml"
    policy.write_text(f'[gate]\ntarget = "{lib}:Net"\n'
                      f'target_kwargs = {{ cfg = {{ "()" = "{lib}:Cfg", width = 2 }} }}\n')
    report = gate([str(path)], policy=load_policy(policy))
    (match,) = [c for c in report.files[0].checks if c.name == "matches-target"]
    assert match.passed and not match.skipped, match


# ------------------------------------------------------------------ real transformers

BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "vocab_size": 99, "max_position_embeddings": 40}


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="needs transformers (requirements-test.txt)")
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert") / "bert"
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(folder)
    return folder


def test_bert_with_a_config_built_by_the_callable_matches_its_save_pretrained_folder(run_cli, bert_folder):
    from transformers import BertModel

    kwargs = {"config": {"()": "transformers:BertConfig", **BERT}}
    target = build_target("transformers:BertModel", kwargs)
    assert target.device == "meta"
    reference = BertModel.from_pretrained(bert_folder).state_dict()
    assert {t.key: (t.dtype, t.shape) for t in target.tensors} == {
        k: (str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in reference.items()}
    r = run_cli("diff", str(bert_folder), "--target", "transformers:BertModel", "--target-kwargs", json.dumps(kwargs),
                "--json")
    doc = json.loads(r.out)
    assert r.code == 0 and doc["equal"], r.out
    assert not (doc["missing"] or doc["unexpected"] or doc["shape_mismatch"] or doc["dtype_mismatch"])


def test_a_classmethod_target_and_a_classmethod_argument(run_cli, bert_folder):
    pytest.importorskip("transformers")
    kwargs = {"config": {"()": "transformers:BertConfig.from_json_file", "json_file": str(bert_folder / "config.json")}}
    r = run_cli("diff", str(bert_folder), "--target", "transformers:AutoModel.from_config",
                "--target-kwargs", json.dumps(kwargs))
    assert r.code == 0 and "no differences" in r.out, r.out + r.err
    r = run_cli("diff", str(bert_folder), "--target", "transformers:BertModel",
                "--target-kwargs", '{"config": {"()": "transformers:NoSuchConfig"}}')
    assert r.code == 2 and r.err.strip() == ("ckpt: error: --target-kwargs config.(): transformers:NoSuchConfig not "
                                             "found: transformers has no 'NoSuchConfig'")
