"""The synthetic pipeline and universal writers (benchmarks/generate_deepspeed_parallel.py) against real DeepSpeed.

fixtures/deepspeed_parallel/{pipeline,pipeline_bf16,universal} were written by
DeepSpeed 0.19.8 itself (a PipelineModule run, pp=2; ds_to_universal of a
tp=2 run). Given the same shapes, the generator must write the same file
names, the same pickled structure (keys, types, dtypes, requires_grad) and the
same pickle globals; ckpt must consolidate what it writes to the model it
holds, bit for bit. No DeepSpeed needed: its classes are read as stand-ins.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from tests.helpers import bits

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "formats"))
import generate_deepspeed_parallel as gp  # noqa: E402
from test_deepspeed_layout_generator import load, pickle_globals, signature  # noqa: E402

from ckpt_tool import load as ckpt_load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

FIXTURES = ROOT / "fixtures" / "deepspeed_parallel"


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def assert_same_structure(real: Path, synth: Path) -> None:
    """Same files; each with the same pickled structure and the same GLOBALs as DeepSpeed's."""
    assert _files(synth) == _files(real)
    for name in _files(real):
        a, b = load(str(real / name)), load(str(synth / name))
        assert signature(b) == signature(a), name
        if isinstance(a, dict):
            assert list(b) == list(a), name  # DeepSpeed's key order
        assert pickle_globals(str(synth / name)) == pickle_globals(str(real / name)), name


def assert_bit_equal(path: Path, expected: OrderedDict[str, Any]) -> None:
    bits.assert_bit_equal(st.load_file(str(path)), expected)


def pipeline_spec(run: Path, bf16: bool) -> gp.PipelineSpec:
    """The real run's layers (its layer files' keys and shapes; the buffers its model states name)."""
    tag = run / "global_step1"
    buffers = [b for s in range(2) for b in load(str(tag / f"mp_rank_{s:02d}_model_states.pt"))["buffer_names"]]
    layers: list[list[tuple[str, tuple[int, ...]]]] = []
    extra: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for i in range(len(list(tag.glob("layer_*")))):
        sd = load(str(tag / f"layer_{i:02d}-model_states.pt"))
        layers.append([(k, tuple(v.shape)) for k, v in sd.items() if f"{i}.{k}" not in buffers])
        extra[i] = [(k, tuple(v.shape)) for k, v in sd.items() if f"{i}.{k}" in buffers]
    cfg = load(str(tag / "mp_rank_00_model_states.pt"))["ds_config"]
    return gp.PipelineSpec(layers, 2, buffers=extra, bf16=bf16, config=cfg)


@pytest.mark.parametrize("name", ["pipeline", "pipeline_bf16"])
def test_pipeline_has_deepspeeds_structure_and_consolidates(tmp_path, name):
    run = FIXTURES / name
    spec = pipeline_spec(run, bf16=name.endswith("bf16"))
    gp.write_pipeline(str(tmp_path / "run"), spec)
    assert (tmp_path / "run" / "latest").read_text() == "global_step1"
    assert_same_structure(run / "global_step1", tmp_path / "run" / "global_step1")
    ck = ckpt_load(tmp_path / "run")
    info = ck.metadata["deepspeed"]
    assert (info["layout"], info["pp"], info["tp"]) == ("pipeline", 2, 1)
    assert [t.key for t in ck.tensors] == [t.key for t in ckpt_load(run).tensors]
    assert migrate(tmp_path / "run", tmp_path / "out.safetensors", workers=2).ok
    assert_bit_equal(tmp_path / "out.safetensors", gp.expected_pipeline(spec))


def test_llama_pipeline_spreads_layers_as_deepspeed_uniform():
    """DeepSpeed's partition_uniform: the first stages take the remainder."""
    spec = gp.llama_pipeline_spec(0.05, 4)
    assert gp.partition_uniform(6, 2) == [0, 3, 6] and gp.partition_uniform(7, 3) == [0, 3, 5, 7]
    assert spec.layers[0] == [("weight", (32000, 1024))] and spec.layers[-1] == [("weight", (32000, 1024))]


def universal_spec() -> gp.UniversalSpec:
    """The real universal checkpoint's parameters (full shapes, cat_dim), its rules and vocabulary padding."""
    tag = FIXTURES / "universal" / "global_step1_universal"
    m0 = load(str(tag / "mp_rank_00_model_states.pt"))
    params, vocab = [], []
    for name in m0["param_shapes"][0]:
        fp32 = load(str(tag / "zero" / name / "fp32.pt"))
        params.append((name, tuple(fp32["param"].shape), fp32.get("cat_dim")))
        if fp32.get("vocab_tensor"):
            vocab.append(name)
    info = m0["universal_checkpoint_info"]
    padding = 2 * m0["param_shapes"][0][vocab[0]][0] - info["original_vocab_size"]
    return gp.UniversalSpec(params, 2, vocab=tuple(vocab), uc_info=info, config=m0["ds_config"],
                            vocab_padding=padding)


def test_universal_has_ds_to_universals_structure_and_consolidates(tmp_path):
    spec = universal_spec()
    gp.write_universal(str(tmp_path / "run"), spec)
    assert (tmp_path / "run" / "latest_universal").read_text() == "global_step1_universal"
    real = FIXTURES / "universal" / "global_step1_universal"
    assert_same_structure(real, tmp_path / "run" / "global_step1_universal")
    ck = ckpt_load(tmp_path / "run")
    assert ck.metadata["deepspeed"]["layout"] == "universal"
    real_keys = [(t.key, t.shape) for t in ckpt_load(FIXTURES / "universal").tensors]
    assert [(t.key, t.shape) for t in ck.tensors] == real_keys
    assert migrate(tmp_path / "run", tmp_path / "out.safetensors").ok
    assert_bit_equal(tmp_path / "out.safetensors", gp.expected_universal(spec))


def test_llama_universal_rules_name_each_split():
    spec = gp.llama_universal_spec(0.05, 2)
    info = gp._uc_info(spec)
    assert r"model\.layers\.0\.self_attn\.o_proj\.weight$" in info["parameter_with_row_parallelism_patterns"]
    assert r"model\.norm\.weight$" in info["tp_replicated_parameter_patterns"]
    assert info["original_vocab_size"] == 32000
