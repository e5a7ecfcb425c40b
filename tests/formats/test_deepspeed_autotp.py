"""A DeepSpeed AutoTP training run merged by the rules it records (issue 24).

fixtures/deepspeed_parallel/autotp/ is DeepSpeed 0.19.8's own AutoTP (``"tensor_parallel": {"autotp_size": 2,
"partition_config": ...}``, ZeRO-1, 2 gloo ranks on CPU; fixtures/deepspeed_parallel/generate.py --kind autotp):
a fused q/k/v projection with unequal widths, column- and row-parallel linears, a vocabulary-parallel lm_head and
replicated norms and embedding. Each rank writes ``mp_rank_0T_model_states.pt`` and its ZeRO-1 file; the model
states hold ``universal_checkpoint_info`` version 0.4 with AutoTP's ``affine_map`` (where every block of every
parameter lives on each rank). ``expected.safetensors`` is the live modules' shards gathered by the split the
layer specs ask for; ``universal/`` is DeepSpeed's ds_to_universal of the same run (generate.py checked it equal).
``autotp_zero3/`` is the same run under ZeRO-3. No test here starts DeepSpeed.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from tests.helpers import tp_fixtures
from tests.helpers.bits import bits
from tests.helpers.errors import assert_one_line_error

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

RUN = ROOT / "fixtures" / "deepspeed_parallel" / "autotp"
UNI = RUN / "universal"
SHAPES = {"embed.weight": [18, 8], "layers.0.norm.weight": [8], "layers.0.norm.bias": [8],
          "layers.0.qkv.weight": [16, 8], "layers.0.qkv.bias": [16], "layers.0.o.weight": [8, 8],
          "layers.0.o.bias": [8], "layers.0.up.weight": [12, 8], "layers.0.up.bias": [12],
          "layers.0.down.weight": [8, 12], "layers.0.down.bias": [8], "norm.weight": [8], "norm.bias": [8],
          "lm_head.weight": [18, 8]}


def assert_bit_equal(path: Path) -> None:
    tp_fixtures.assert_bit_equal(path, RUN / "expected.safetensors")


def _states(run: Path, rank: int) -> Path:
    return run / "global_step1" / f"mp_rank_{rank:02d}_model_states.pt"


def _edited(tmp_path: Path, edit) -> Path:
    """A copy of the run whose ranks' universal_checkpoint_info ``edit`` changed (rewritten by torch, weights_only)."""
    run = tmp_path / "autotp"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("universal", "*.safetensors", "*.json"))
    for rank in (0, 1):
        states = torch.load(_states(run, rank), weights_only=True)
        edit(states["universal_checkpoint_info"])
        torch.save(states, _states(run, rank))
    return run


def test_each_tp_rank_wrote_its_files_and_autotps_record_format():
    """What DeepSpeed 0.19.8 AutoTP saves, and the record ckpt reads (pinned, so a new format is noticed)."""
    names = sorted(p.name for p in (RUN / "global_step1").iterdir())
    assert names == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
                     "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    states = torch.load(_states(RUN, 1), weights_only=True)
    assert states["mp_world_size"] == 2 and states["checkpoint_parallel_dimensions"] == {"pp_degree": 1,
                                                                                         "tp_degree": 2}
    assert list(states["module"]["layers.0.qkv.weight"].shape) == [8, 8]  # rank 1's q, k and v rows
    info = states["universal_checkpoint_info"]
    assert info["universal_checkpoint_version"] == 0.4 and info["affine_map"]["version"] == 1
    assert set(info["affine_map"]["params"]) == {f"^{k.replace('.', chr(92) + '.')}$" for k in SHAPES}
    assert info["parameter_with_sub_params"][0]["patterns"] == [r"^layers\.0\.qkv\.weight$"]
    assert info["sub_param_shard_widths"][r"^layers\.0\.qkv\.weight$"] == [[4, 4], [2, 2], [2, 2]]
    assert info["vocabulary_parameter_patterns"] == [r"^lm_head\.weight$"] and info["original_vocab_size"] == 18


def test_inspect_shows_the_whole_model():
    ck = load(RUN)
    assert {t.key: list(t.shape) for t in ck.tensors} == SHAPES
    info = ck.metadata["deepspeed"]
    assert (info["layout"], info["pp"], info["tp"]) == ("tensor-parallel", 1, 2)
    assert info["tp_rules"] == {"from": "universal_checkpoint_info", "merged": {"affine-map": 14}}


def test_inspect_cli(run_cli):
    r = run_cli("inspect", str(RUN))
    assert r.code == 0, r
    assert "tensor-parallel pp=1 tp=2" in r.out and "[16, 8]" in r.out


@pytest.mark.parametrize("workers", [1, 2])
def test_migrate_is_bit_equal_to_the_gathered_live_model(tmp_path, workers):
    out = tmp_path / "model.safetensors"
    assert migrate(RUN, out, workers=workers).ok
    assert_bit_equal(out)


def test_a_zero3_autotp_run_is_merged_bit_for_bit(tmp_path):
    """autotp_zero3/: the same model under ZeRO-3 (zero_pp_rank_0_mp_rank_0T_* files, parameters shaped [0])."""
    run = RUN.parent / "autotp_zero3"
    assert sorted(p.name for p in (run / "global_step1").iterdir()) == [
        f"zero_pp_rank_0_mp_rank_0{t}_{kind}_states.pt" for t in (0, 1) for kind in ("model", "optim")]
    ck = load(run)
    assert {t.key: list(t.shape) for t in ck.tensors} == SHAPES
    assert ck.metadata["deepspeed"]["tp_rules"]["merged"] == {"affine-map": 14}
    out = tmp_path / "model.safetensors"
    assert migrate(run, out).ok
    got, expected = st.load_file(str(out)), st.load_file(str(run / "expected.safetensors"))
    assert sorted(got) == sorted(expected) and all(torch.equal(bits(got[k]), bits(v)) for k, v in expected.items())


def test_ckpts_merge_and_ds_to_universals_are_the_same_bytes(tmp_path):
    a, b = tmp_path / "autotp.safetensors", tmp_path / "universal.safetensors"
    assert migrate(RUN, a).ok and migrate(UNI, b).ok
    assert a.read_bytes() == b.read_bytes()


def test_one_ranks_files_are_refused_naming_the_recorded_tp(tmp_path, run_cli):
    run = tmp_path / "autotp"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("universal", "*mp_rank_01*"))
    assert_one_line_error(run_cli("inspect", str(run)), "pp=1 x tp=2", "only mp_rank_00")


@pytest.mark.parametrize("edit", [lambda info: info.pop("affine_map"),
                                  lambda info: info["affine_map"].update(version=2)],
                         ids=["no-affine-map", "newer-map-version"])
def test_the_patterns_alone_merge_it_bit_for_bit(tmp_path, edit):
    """A converter that predates the map reads the categories: sub-parameters by sub_param_shard_widths."""
    run = _edited(tmp_path, edit)
    assert load(run).metadata["deepspeed"]["tp_rules"]["merged"] == {
        "replicated": 7, "sub-params": 2, "concatenated along dim 0": 3, "concatenated along dim 1": 2}
    out = tmp_path / "model.safetensors"
    assert migrate(run, out).ok
    assert_bit_equal(out)


def _without_widths(version, shape):
    def edit(info):
        info.pop("affine_map")
        info.pop("sub_param_shard_widths")
        info["universal_checkpoint_version"] = version
        for entry in info["parameter_with_sub_params"]:
            entry["shape"] = shape[:len(entry["shape"])] if len(shape) == 2 else shape  # the bias: 1-d
    return edit


def test_sub_parameters_recorded_before_widths_split_evenly(tmp_path):
    """Universal checkpoint 0.3: the q/k/v sizes and no widths: the even split ds_to_universal assumes."""
    out = tmp_path / "model.safetensors"
    assert migrate(_edited(tmp_path, _without_widths(0.3, [[8, 4, 4], -1])), out).ok
    assert_bit_equal(out)


@pytest.mark.parametrize(("version", "shape", "needle"), [
    (0.4, [[8, 4, 4], -1], "records no sub_param_shard_widths"),
    (0.3, [3, -1], "do not split evenly over 2 ranks"),  # 16 rows are not 3 equal sub-parameters
    (0.3, [[8, 4, 4], 2, -1], "views it with another shape"),
])
def test_sub_parameters_that_cannot_be_placed_are_refused(tmp_path, run_cli, version, shape, needle):
    r = run_cli("inspect", str(_edited(tmp_path, _without_widths(version, shape))))
    assert_one_line_error(r, needle)


def _params(info):
    return info["affine_map"]["params"]


def test_a_scaled_block_is_refused(tmp_path, run_cli):
    def scale(info):
        _params(info)[r"^layers\.0\.o\.bias$"]["ranks"][1]["pieces"][0]["scale"] = 0.5

    r = run_cli("inspect", str(_edited(tmp_path, scale)))
    assert_one_line_error(r, "'layers.0.o.bias'", "scaled by 0.5", "does not compute")


def test_a_map_with_a_hole_is_refused(tmp_path, run_cli):
    def hole(info):
        _params(info)[r"^layers\.0\.qkv\.weight$"]["ranks"][1]["pieces"].pop(1)  # rank 1's k rows

    r = run_cli("migrate", str(_edited(tmp_path, hole)), "-o", str(tmp_path / "o.safetensors"))
    assert_one_line_error(r, "'layers.0.qkv.weight'", "leaves elements 80..95", "exactly once")


def test_a_block_two_ranks_hold_is_checked_equal(tmp_path, run_cli):
    """A map calling up.bias one block both ranks hold: the ranks' halves differ, so migrate fails, no output."""
    def shared(info):
        piece = {"shape": [6], "source": [0, [1]], "dest": [0, [1]], "locations": [0, 1]}
        _params(info)[r"^layers\.0\.up\.bias$"] = {
            "logical_shape": [6], "ranks": {r: {"shard_shape": [6], "pieces": [piece]} for r in (0, 1)}}

    run = _edited(tmp_path, shared)
    assert load(run).metadata["deepspeed"]["tp_rules"]["merged"] == {"affine-map": 14}  # inspect reads no bytes
    out = tmp_path / "o.safetensors"
    r = run_cli("migrate", str(run), "-o", str(out))
    assert_one_line_error(r, "'layers.0.up.bias' differs between tensor-parallel ranks 0 and 1")
    assert not out.exists() and not list(tmp_path.glob("o.safetensors*"))


def test_the_users_rules_file_wins_over_the_map(tmp_path, run_cli):
    """--tp-rules replaces the run's record: plain dim-0 concatenation everywhere makes q/k/v rank-major."""
    rules = tmp_path / "rules.toml"
    rules.write_text('replicated = ["*norm.*", "embed.*", "*.o.bias", "*.down.bias"]\n'
                     '[[tp]]\npattern = "*.o.weight"\ndim = 1\n[[tp]]\npattern = "*.down.weight"\ndim = 1\n'
                     '[[tp]]\npattern = "*"\ndim = 0\n')
    out = tmp_path / "model.safetensors"
    r = run_cli("migrate", str(RUN), "-o", str(out), "--tp-rules", str(rules))
    assert r.code == 0, r
    got, expected = st.load_file(str(out)), st.load_file(str(RUN / "expected.safetensors"))
    assert torch.equal(got["layers.0.up.weight"], expected["layers.0.up.weight"])
    assert not torch.equal(got["layers.0.qkv.weight"], expected["layers.0.qkv.weight"])  # rank-major, not q|k|v


def test_a_map_pattern_that_is_a_regex_is_matched_as_one(tmp_path):
    """AutoTP writes ``^<name>$``; another regex is matched with re.match, as ds_to_universal does."""
    def regex(info):
        _params(info)[r"layers\.0\.up\.w.*"] = _params(info).pop(r"^layers\.0\.up\.weight$")

    run = _edited(tmp_path, regex)
    assert load(run).metadata["deepspeed"]["tp_rules"]["merged"] == {"affine-map": 14}
    out = tmp_path / "model.safetensors"
    assert migrate(run, out).ok
    assert_bit_equal(out)


@pytest.mark.parametrize(("edit", "needles"), [
    (lambda info: _params(info).update({r".*\.up\.weight$": _params(info)[r"^layers\.0\.up\.weight$"]}),
     ("two affine_map patterns match 'layers.0.up.weight'", "ambiguous")),
    (lambda info: _params(info)[r"^norm\.bias$"].pop("ranks"), ("affine_map entry for", "malformed")),
    (lambda info: _params(info)[r"^norm\.bias$"]["ranks"].pop(1), ("describes 1 tensor-parallel rank(s)",)),
], ids=["two-patterns", "no-ranks", "one-rank"])
def test_a_bad_affine_map_is_one_line(tmp_path, run_cli, edit, needles):
    assert_one_line_error(run_cli("inspect", str(_edited(tmp_path, edit))), *needles)


@pytest.mark.parametrize(("source", "workers"), [("autotp", "1"), ("autotp_zero3", "2")])
def test_a_url_gives_the_local_output(run_cli, tmp_path, source, workers):
    """The run served over HTTP (tests/helpers/remote_servers.py on 127.0.0.1): the same bytes as the local migrate."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    from tests.helpers.remote_servers import RangeServer

    local, remote = tmp_path / "local.safetensors", tmp_path / "remote.safetensors"
    assert run_cli("migrate", str(RUN.parent / source), "-o", str(local)).code == 0
    with RangeServer(RUN.parent) as server:
        r = run_cli("migrate", f"{server.url}/{source}/", "-o", str(remote), "--workers", workers)
    assert r.code == 0, r
    assert remote.read_bytes() == local.read_bytes()


def test_a_strided_piece_is_placed_element_by_element(tmp_path):
    """A map that interleaves the ranks' halves of up.bias (rank 0 the even elements, rank 1 the odd ones)."""
    def interleave(info):
        _params(info)[r"^layers\.0\.up\.bias$"]["ranks"] = {
            r: {"shard_shape": [6], "pieces": [{"shape": [6], "source": [r, [2]], "dest": [0, [1]],
                                                 "locations": [r]}]} for r in (0, 1)}

    out = tmp_path / "model.safetensors"
    assert migrate(_edited(tmp_path, interleave), out).ok
    halves = st.load_file(str(RUN / "expected.safetensors"))["layers.0.up.bias"].split(6)
    assert torch.equal(st.load_file(str(out))["layers.0.up.bias"], torch.stack(halves, 1).reshape(12))
