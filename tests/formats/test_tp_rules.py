"""Tensor-parallel shards merged by rules: the run's universal_checkpoint_info, or --tp-rules FILE (issue 24).

fixtures/deepspeed_parallel/tp/ is a tp=2 run DeepSpeed 0.19.8 wrote
(fixtures/deepspeed_parallel/generate.py: embedding rows and fc1 split on dim 0,
fc2's weight on dim 1, norms and fc2's bias replicated, the vocabulary padded
from 17 to 18 rows), recording Megatron-DeepSpeed's universal_checkpoint_info;
``expected.safetensors`` is the live ranks' parameters concatenated. A copy
without that record is what a run that records no rules looks like.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from ckpt_tool.errors import UsageError
from ckpt_tool.format_names import TpMerge
from ckpt_tool.formats.tp.tprules import TpRule, from_universal_info, parse_rules
from tests.helpers import tp_fixtures as tp
from tests.helpers.bits import bits
from tests.helpers.errors import assert_one_line_error

RUN = tp.TP_RUN
RULES = tp.TP_RULES



# -- the rules, torch-free --------------------------------------------------------------------------------------
def test_a_rules_file_parses_in_order():
    rules = parse_rules(RULES, "rules.toml")
    assert rules.rule_for("norm.weight") == TpRule("norm.*", TpMerge.REPLICATED)
    assert rules.rule_for("fc2.weight") == TpRule("fc2.weight", TpMerge.CONCAT, 1)
    assert rules.rule_for("fc1.weight") == TpRule("*", TpMerge.CONCAT, 0)
    assert rules.vocab_rows("embed.weight") == 17 and rules.vocab_rows("fc1.weight") is None


def test_a_key_no_rule_names_has_no_rule():
    rules = parse_rules('[[tp]]\npattern = "*.dense_h_to_4h.weight"\ndim = 0\n', "r.toml")
    assert rules.rule_for("layers.0.mlp.dense_h_to_4h.weight") is not None
    assert rules.rule_for("layers.0.mlp.dense_4h_to_h.weight") is None


@pytest.mark.parametrize(("text", "needle"), [
    ("[[tp]]\npattern = 'a'\n", "needs 'dim'"),
    ("[[tp]]\npattern = 'a'\ndim = -1\n", "needs 'dim'"),
    ("[[tp]]\ndim = 0\n", "no 'pattern'"),
    ("[[tp]]\npattern = 'a'\ndim = 0\nsplit = 1\n", "only 'pattern' and 'dim'"),
    ("replicated = 'a'\n", "list of patterns"),
    ("colum = []\n", "unknown entries 'colum'"),
    ("[vocab]\npattern = 'e'\n", "[vocab] needs"),
    ("", "names no pattern"),
    ("[[tp]\n", "not a TOML rules file"),
])
def test_a_bad_rules_file_is_a_usage_error(text, needle):
    with pytest.raises(UsageError) as info:
        parse_rules(text, "rules.toml")
    assert needle in info.value.message


def test_universal_checkpoint_info_rules_follow_ds_to_universal():
    rules = from_universal_info({
        "tp_replicated_parameter_patterns": [r"norm\."], "parameter_with_row_parallelism_patterns": [r".*dense_4h"],
        "parameter_with_2_sub_params_cat_dim_0": [r".*h_to_4h"], "parameter_to_average_patterns": [r"avg"],
        "vocabulary_parameter_patterns": [r"embed"], "original_vocab_size": 5})
    assert rules.rule_for("norm.weight").merge is TpMerge.REPLICATED
    assert rules.rule_for("x.dense_4h_to_h.weight") == TpRule(r".*dense_4h", TpMerge.CONCAT, 1)
    assert rules.rule_for("x.dense_h_to_4h.weight").merge is TpMerge.TWO_SUB_PARAMS
    assert rules.rule_for("anything") == TpRule("", TpMerge.CONCAT, 0)  # DeepSpeed's default: dim 0
    assert "averaged" in rules.unsupported_for("avg.weight")
    assert rules.vocab_rows("embed.weight") == 5


# -- real runs ----------------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402


def assert_bit_equal(path: Path) -> None:
    tp.assert_bit_equal(path, RUN / "expected.safetensors")


_without_rules = tp.run_without_recorded_rules


def test_one_ranks_files_are_not_read_as_the_model(tmp_path, run_cli):
    """tp=2 recorded, only mp_rank_00 here (a rank that did not save, or files left over): not half a model."""
    run = tmp_path / "tp"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("*.safetensors", "*.json", "*mp_rank_01*"))
    assert_one_line_error(run_cli("inspect", str(run)), "pp=1 x tp=2", "only mp_rank_00")


def test_inspect_shows_the_merged_model():
    ck = load(RUN)
    shapes = {t.key: list(t.shape) for t in ck.tensors}
    assert shapes == {"embed.weight": [17, 8], "fc1.weight": [12, 8], "fc1.bias": [12], "fc2.weight": [8, 12],
                      "fc2.bias": [8], "norm.weight": [8], "norm.bias": [8]}
    info = ck.metadata["deepspeed"]
    assert (info["layout"], info["pp"], info["tp"]) == ("tensor-parallel", 1, 2)
    assert info["tp_rules"]["from"] == "universal_checkpoint_info"
    assert info["tp_rules"]["merged"] == {"concatenated along dim 0": 3, "concatenated along dim 1": 1,
                                          "replicated": 3}


@pytest.mark.parametrize("workers", [1, 2])
def test_the_runs_own_rules_merge_it_bit_for_bit(tmp_path, workers):
    out = tmp_path / "model.safetensors"
    assert migrate(RUN, out, workers=workers).ok
    assert_bit_equal(out)


def test_without_rules_one_line_names_the_parallelism_and_what_is_missing(tmp_path, run_cli):
    run = _without_rules(tmp_path)
    for args in (("inspect", str(run)), ("migrate", str(run), "-o", str(tmp_path / "o.safetensors"))):
        assert_one_line_error(run_cli(*args), "pp=1, tp=2", "universal_checkpoint_info", "--tp-rules")
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_rules_file_merges_a_run_that_records_none(tmp_path, run_cli, workers):
    run = _without_rules(tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    out = tmp_path / "model.safetensors"
    r = run_cli("migrate", str(run), "-o", str(out), "--tp-rules", str(rules), "--workers", workers)
    assert r.code == 0, r
    assert_bit_equal(out)


def test_the_users_rules_win_over_the_runs(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES.replace("size = 17", "size = 18"))  # keep the padding row
    out = tmp_path / "model.safetensors"
    assert migrate(RUN, out, tp_rules=str(rules)).ok
    assert st.load_file(str(out))["embed.weight"].shape == (18, 8)


def test_a_key_the_rules_miss_is_named(tmp_path, run_cli):
    run = _without_rules(tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text('replicated = ["norm.*", "fc2.bias"]\n[[tp]]\npattern = "fc*.weight"\ndim = 0\n')
    r = run_cli("migrate", str(run), "-o", str(tmp_path / "o.safetensors"), "--tp-rules", str(rules))
    assert_one_line_error(r, "'embed.weight'", "'fc1.bias'", "pp=1, tp=2")


def test_replicated_tensors_are_checked_equal_across_ranks(tmp_path, run_cli):
    """fc1.bias differs between the ranks (each holds its own half): calling it replicated fails, no output."""
    run = _without_rules(tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES.replace('"fc2.bias"]', '"fc2.bias", "fc1.bias"]'))
    out = tmp_path / "o.safetensors"
    r = run_cli("migrate", str(run), "-o", str(out), "--tp-rules", str(rules))
    assert_one_line_error(r, "'fc1.bias' differs between tensor-parallel ranks 0 and 1")
    assert not out.exists() and not list(tmp_path.glob("o.safetensors*"))


def test_a_bad_rules_file_is_exit_2(tmp_path, run_cli):
    rules = tmp_path / "rules.toml"
    rules.write_text("[[tp]]\npattern = 'x'\n")
    r = run_cli("migrate", str(RUN), "-o", str(tmp_path / "o.safetensors"), "--tp-rules", str(rules))
    assert_one_line_error(r, "needs 'dim'")
    assert_one_line_error(run_cli("migrate", str(RUN), "-o", str(tmp_path / "o.safetensors"), "--tp-rules",
                                  str(tmp_path / "none.toml")), "cannot read the tensor-parallel rules file")


def test_a_zero_stage_0_run_merges_from_its_module_states(tmp_path):
    """mp_rank_XX_model_states.pt alone (no optimizer files): each rank's module, merged by the rules file."""
    run = _without_rules(tmp_path)
    for f in (run / "global_step1").glob("*_optim_states.pt"):
        f.unlink()
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES)
    out = tmp_path / "model.safetensors"
    assert migrate(run, out, tp_rules=str(rules)).ok
    assert_bit_equal(out)  # fp32 training: the module is the master weights


# -- Megatron-LM's legacy mp_rank_XX/model_optim_rng.pt -------------------------------------------------------
MEG = ROOT / "fixtures" / "deepspeed_parallel" / "megatron_legacy"


def test_megatron_legacy_without_rules_is_one_line_naming_the_sizes(run_cli):
    assert_one_line_error(run_cli("inspect", str(MEG)), "Megatron-LM", "pp=1, tp=2", "--tp-rules")


@pytest.mark.parametrize(("ext", "workers"), [(".safetensors", "1"), (".safetensors", "2"), (".pth", "1")])
def test_megatron_legacy_merged_by_the_rules_file(tmp_path, run_cli, ext, workers):
    out = tmp_path / f"model{ext}"
    r = run_cli("migrate", str(MEG), "-o", str(out), "--tp-rules", str(MEG / "rules.toml"), "--workers", workers)
    assert r.code == 0, r
    got = torch.load(out, weights_only=True) if ext == ".pth" else st.load_file(str(out))
    expected = st.load_file(str(MEG / "expected.safetensors"))
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].shape == v.shape and torch.equal(bits(got[k]), bits(v)), k
    assert got["language_model.embedding.word_embeddings.weight"].shape == (15, 8)  # padding cut


def test_megatron_legacy_inspect_with_rules(tmp_path):
    ck = load(MEG, tp_rules=parse_rules((MEG / "rules.toml").read_text(), "rules.toml"))
    assert ck.format == "megatron-legacy" and ck.metadata["megatron"]["tp"] == 2
    shapes = {t.key: list(t.shape) for t in ck.tensors}
    assert shapes["language_model.encoder.layers.0.mlp.dense_4h_to_h.weight"] == [8, 32]
    assert shapes["language_model.encoder.layers.0.self_attention.query_key_value.weight"] == [24, 8]


def test_megatron_legacy_inspect_says_what_it_is(run_cli):
    r = run_cli("inspect", str(MEG), "--tp-rules", str(MEG / "rules.toml"))
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if x.startswith("training:"))
    assert "Megatron-LM legacy checkpoint, iteration iter_0000001, pp=1 tp=2, merged by" in line
    assert "torch_dist" not in line and "common.pt" not in line  # not Megatron-core's torch_dist line


def test_megatron_legacy_missing_rank_is_named(tmp_path, run_cli):
    run = tmp_path / "meg"
    shutil.copytree(MEG, run)
    shutil.rmtree(run / "iter_0000001" / "mp_rank_01")
    assert_one_line_error(run_cli("inspect", str(run)), "tensor_model_parallel_size=2", "tp=1")


# -- streamed: memory bounded by the largest tensor + 150 MB ------------------------------------------------------
_PEAK = ("import json, sys; from ckpt_tool.cli import main; code = main(sys.argv[1:]); "
         "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]; "
         "print(json.dumps({'code': code, 'peak': int(hwm) * 1024}))")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_merge_larger_than_the_bound_is_streamed(tmp_path):
    """24 tensors of 8 MiB merged from 2 ranks, half split along dim 1 (row-parallel): peak RSS stays bounded."""
    import json
    import os
    import subprocess
    import sys
    from collections import OrderedDict

    g = torch.Generator().manual_seed(0)
    full = OrderedDict((f"layers.{i}.{'col' if i % 2 else 'row'}.weight", torch.randn(1024, 2048, generator=g))
                       for i in range(24))
    full["norm.weight"] = torch.randn(2048, generator=g)
    tag = tmp_path / "run" / "global_step1"
    tag.mkdir(parents=True)
    (tmp_path / "run" / "latest").write_text("global_step1")
    for t in range(2):
        module = OrderedDict((k, v if k == "norm.weight" else v.chunk(2, 0 if ".col." in k else 1)[t].clone())
                             for k, v in full.items())
        torch.save({"module": module, "buffer_names": [], "param_shapes": [OrderedDict(
            (k, v.shape) for k, v in module.items())], "dp_world_size": 1, "mp_world_size": 2,
            "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 2}, "ds_version": "0.19.8"},
            tag / f"mp_rank_{t:02d}_model_states.pt")
    rules = tmp_path / "rules.toml"
    rules.write_text('replicated = ["norm.*"]\n[[tp]]\npattern = "*.row.*"\ndim = 1\n[[tp]]\npattern = "*"\n'
                     'dim = 0\n')
    out = tmp_path / "m.safetensors"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _PEAK, "migrate", str(tmp_path / "run"), "-o", str(out),
                        "--tp-rules", str(rules), "--workers", "1", "-q"], check=False, capture_output=True, text=True,
                       env=env, timeout=600)
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0, r.stderr
    largest, total = 8 << 20, 24 * (8 << 20)
    assert total > largest + (150 << 20)  # holding the model would break the bound
    assert doc["peak"] < largest + (150 << 20), doc
    got = st.load_file(str(out))
    for k, v in full.items():
        assert torch.equal(bits(got[k]), bits(v)), k


def test_inspect_takes_the_rules_too(run_cli):
    r = run_cli("inspect", "--json", str(MEG), "--tp-rules", str(MEG / "rules.toml"))
    assert r.code == 0, r
    import json

    doc = json.loads(r.out)
    shapes = {t["key"]: t["shape"] for t in doc["tensors"]}
    assert shapes["language_model.embedding.word_embeddings.weight"] == [15, 8]
    assert doc["metadata"]["megatron"]["tp_rules"]["merged"]["replicated"] == 9
