"""DeepSpeed run folders read as the consolidated model (issue 14).

fixtures/deepspeed/ holds runs written by DeepSpeed 0.19.8 itself (ZeRO 1-3,
fp32 and bf16, 2 ranks) with DeepSpeed's own consolidation beside each
(``expected.safetensors``); synthetic folders of other rank counts come from
benchmarks/generate_training.py (ZeRO-3) and ``write_zero2`` below (ZeRO-1/2,
DeepSpeed's partitioning rule from fixtures/deepspeed/LAYOUT.md).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from conftest import ROOT

from tests.helpers.bits import bits
from tests.helpers.errors import assert_one_line_error
from tests.helpers.outputs import read_output

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_training as gt  # noqa: E402

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402
from ckpt_tool.formats.deepspeed.merge import zero2_group, zero3_params  # noqa: E402
from ckpt_tool.io.segments import Part, SegmentSource, concat_slice  # noqa: E402

DS = ROOT / "fixtures" / "deepspeed"
RUNS = [f"zero{s}_{d}" for s in (1, 2, 3) for d in ("fp32", "bf16")]


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


_read_output = read_output


def _expected(run: str) -> tuple[dict, dict, dict]:
    exp = st.load_file(str(DS / run / "expected.safetensors"))
    model = st.load_file(str(DS / run / "model_state.safetensors"))
    info = json.loads((DS / run / "expected.json").read_text())
    return exp, model, info


# ------------------------------------------------------------------ inspect

@pytest.mark.parametrize("run", RUNS)
def test_inspect_lists_the_consolidated_model(run):
    _, _, info = _expected(run)
    ck = load(DS / run)
    assert ck.format == "deepspeed" and ck.framework == "deepspeed"
    got = {t.key: (t.dtype, list(t.shape)) for t in ck.tensors}
    want = {k: (v["dtype"], v["shape"]) for k, v in info["expected"].items()}
    for k in info["only_in_model_state"]:  # ZeRO-1: DeepSpeed drops the frozen params; ckpt keeps them
        want[k] = (info["model_state"][k]["dtype"], info["model_state"][k]["shape"])
    assert got == want
    assert list(got) == ["pos", "steps", "embed.weight", "proj.weight", "proj.bias", "norm.weight", "norm.bias",
                         "frozen.weight", "frozen.bias", "aux.weight", "aux.bias", "lm_head.weight"]  # module order
    by_key = ck.by_key
    assert by_key["lm_head.weight"].storage is by_key["embed.weight"].storage  # the tie
    ds = ck.metadata["deepspeed"]
    assert (ds["zero_stage"], ds["world_size"], ds["tag"]) == (int(run[4]), 2, "global_step1")
    assert ds["dtype"] == ("bfloat16" if run.endswith("bf16") else "float32")
    assert set(ck.metadata["optimizer"]["state"]) == {"step", "exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("run", ["zero2_bf16", "zero3_fp32"])
def test_run_folder_and_tag_folder_are_the_same_checkpoint(run):
    a, b = load(DS / run), load(DS / run / "global_step1")
    assert [(t.key, t.dtype, t.shape) for t in a] == [(t.key, t.dtype, t.shape) for t in b]
    assert b.metadata["deepspeed"]["tag"] == "global_step1"


def test_inspect_reads_no_tensor_data_and_never_the_adam_moments(monkeypatch, run_cli):
    from ckpt_tool.io.source import FileSource

    def refuse(*a, **k):
        raise AssertionError("tensor data was read")

    monkeypatch.setattr(FileSource, "read", refuse)
    monkeypatch.setattr(FileSource, "read_into", refuse)
    monkeypatch.setattr(SegmentSource, "read", refuse)
    monkeypatch.setattr(SegmentSource, "read_into", refuse)
    for run in RUNS:
        r = run_cli("inspect", str(DS / run), "--json")
        assert r.code == 0, r
        doc = json.loads(r.out)
        assert doc["format"] == "deepspeed"
        assert doc["metadata"]["optimizer"]["state"]["exp_avg"].endswith("(not read)")


def test_one_rank_file_points_at_the_folder(run_cli):
    r = run_cli("inspect", str(DS / "zero3_fp32" / "global_step1" / "zero_pp_rank_1_mp_rank_00_model_states.pt"))
    assert r.code == 0 and f"ckpt inspect {DS / 'zero3_fp32'}` reads the consolidated model" in r.out


def test_inspect_text_says_what_deepspeed_would_drop(run_cli):
    r = run_cli("inspect", str(DS / "zero1_bf16"))
    assert r.code == 0, r
    assert "frozen.weight" in r.out and "leaves them out of ZeRO-1" in r.out
    assert "training:   DeepSpeed ZeRO-1, 2 rank(s), bfloat16, tag global_step1" in r.out
    r = run_cli("inspect", str(DS / "zero3_bf16"))
    assert "bfloat16, the dtype they were trained in" in r.out


# ------------------------------------------------------------------ migrate

@pytest.mark.parametrize("ext", [".safetensors", ".pth"])
@pytest.mark.parametrize("run", RUNS)
def test_migrate_equals_deepspeeds_own_consolidation_bit_for_bit(run, ext, tmp_path):
    exp, model, _ = _expected(run)
    out = tmp_path / f"model{ext}"
    report = migrate(DS / run, out)
    assert report.ok and report.written and report.verified == {"cpu": True}
    got = _read_output(out)
    for k, v in exp.items():
        assert _same(got[k], v), k
    extra = set(got) - set(exp)
    assert extra == ({"frozen.weight", "frozen.bias"} if run.startswith("zero1") else set())
    for k in extra:  # kept from the model states, in the dtype they were trained in
        assert _same(got[k], model[k]), k
    if run.startswith("zero1"):
        assert any("leaves them out of ZeRO-1" in w for w in report.warnings)
    if ext == ".pth":
        assert got["lm_head.weight"].data_ptr() == got["embed.weight"].data_ptr()  # the tie, restored


def test_migrate_applies_every_rule(tmp_path, run_cli):
    exp, _, _ = _expected("zero3_bf16")
    out = tmp_path / "m.safetensors"
    r = run_cli("migrate", str(DS / "zero3_bf16"), "-o", str(out), "--add-prefix", "model.",
                "--rename", r"model\.proj\.(.*)=model.proj2.\1", "--drop", "*.steps", "--dtype", "bfloat16")
    assert r.code == 0, r
    got = _read_output(out)
    assert "model.proj2.weight" in got and "model.steps" not in got and "model.pos" in got
    assert _same(got["model.aux.weight"], exp["aux.weight"].to(torch.bfloat16))
    assert _same(got["model.lm_head.weight"], got["model.embed.weight"])


def test_migrate_sharded_and_dcp(tmp_path):
    exp, _, _ = _expected("zero2_fp32")
    report = migrate(DS / "zero2_fp32", tmp_path / "sharded", max_shard_size="600B")
    assert report.ok and len(report.shards) > 1
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    got = {}
    for name in sorted(set(index["weight_map"].values())):
        got.update(st.load_file(str(tmp_path / "sharded" / name)))
    for k in got:
        assert _same(got[k], exp[k]), k
    report = migrate(DS / "zero2_fp32", tmp_path / "dcp", to="dcp")
    assert report.ok
    back = load(tmp_path / "dcp")
    assert {t.key for t in back} >= set(exp) - {"lm_head.weight"}


def test_migrate_with_a_target_loads_strictly(tmp_path):
    target = tmp_path / "tiny.py"
    target.write_text(
        "import torch\nfrom torch import nn\n"
        "class TinyTied(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(16, 8); self.proj = nn.Linear(8, 8); self.norm = nn.LayerNorm(8)\n"
        "        self.frozen = nn.Linear(8, 5); self.aux = nn.Linear(5, 3)\n"
        "        self.lm_head = nn.Linear(8, 16, bias=False); self.lm_head.weight = self.embed.weight\n"
        "        self.register_buffer('pos', torch.zeros(8))\n"
        "        self.register_buffer('steps', torch.zeros((), dtype=torch.int64))\n"
    )
    report = migrate(DS / "zero1_fp32", tmp_path / "m.safetensors", target=f"{target}:TinyTied")
    assert report.ok and report.target is not None and report.target.ok


# ------------------------------------------------------------------ any number of ranks

def _spec(world: int, bf16: bool = False) -> gt.Zero3Spec:
    groups = [[("a.weight", (7, 3)), ("b.weight", (1,)), ("c.weight", (5, 5))], [("d.bias", (3,)), ("e", ())]]
    return gt.Zero3Spec(groups=groups, world_size=world, frozen=[("f.weight", (3, 4)), ("g", (2,))],
                        buffers={"buf": torch.arange(4, dtype=torch.float32), "n": torch.tensor(3)},
                        shared={"tied.weight": "a.weight"}, bf16=bf16)


@pytest.mark.parametrize("world,bf16", [(1, False), (3, True), (5, False)])
def test_zero3_any_rank_count(tmp_path, world, bf16):
    spec = _spec(world, bf16)
    gt.write_zero3(str(tmp_path / "run"), spec)
    want = gt.expected_state_dict(spec)
    report = migrate(tmp_path / "run", tmp_path / "out.pth")
    assert report.ok
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert set(got) == set(want)
    for k, v in want.items():
        assert _same(got[k], v), k


def write_zero2(folder: Path, groups, world: int, *, stage: int = 2, frozen=(), seed: int = 0) -> dict:
    """A ZeRO-1/2 tag folder by DeepSpeed's rule (LAYOUT.md); returns the consolidated fp32 params."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True)
    values = {}
    partitions: list[list] = [[] for _ in range(world)]
    paddings: list[list[int]] = [[] for _ in range(world)]
    for shapes in groups:
        flat = []
        for name, shape in shapes:
            values[name] = torch.randn(shape, generator=g)
            flat.append(values[name].reshape(-1))
        flat = torch.cat(flat)
        real = flat.numel()
        aligned = 2 * world * math.ceil(real / (2 * world))
        per = aligned // world
        padded = torch.cat([flat, torch.zeros(aligned - real)])
        for r in range(world):
            lo, hi = r * per, (r + 1) * per
            pad = per if lo >= real else max(0, hi - real)
            partitions[r].append(padded[lo:hi - pad].clone())
            paddings[r].append(pad)
    module = OrderedDict((k, v.clone()) for k, v in values.items())
    for name, t in frozen:
        module[name] = t
    model_states = {"module": module, "buffer_names": [], "optimizer": None,
                    "param_shapes": [OrderedDict((n, torch.Size(s)) for n, s in shapes) for shapes in groups],
                    "frozen_param_shapes": None if stage == 1 else OrderedDict((n, t.shape) for n, t in frozen),
                    "shared_params": {}, "frozen_param_fragments": None if stage == 1 else OrderedDict(frozen),
                    "dp_world_size": world, "ds_version": "0.19.8"}
    torch.save(model_states, folder / "mp_rank_00_model_states.pt")
    for r in range(world):
        osd = {"zero_stage": stage, "partition_count": [world] * len(groups),
               "single_partition_of_fp32_groups": partitions[r], "group_paddings": paddings[r],
               "param_alignment_paddings": [[0] * len(s) for s in groups],
               "base_optimizer_state": {"state": {}, "param_groups": []}}
        torch.save({"optimizer_state_dict": osd}, folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return values


@pytest.mark.parametrize("world,stage", [(1, 2), (3, 1), (4, 2), (7, 2)])
def test_zero12_any_rank_count(tmp_path, world, stage):
    groups = [[("w1", (5, 3)), ("w2", (7,)), ("w3", (2, 2, 2))], [("b1", (1,)), ("b2", (3,))]]
    frozen = [("fz", torch.arange(6, dtype=torch.float16))]
    want = write_zero2(tmp_path / "global_step7", groups, world, stage=stage, frozen=frozen)
    want["fz"] = frozen[0][1]
    report = migrate(tmp_path / "global_step7", tmp_path / "out.safetensors")
    assert report.ok
    got = st.load_file(str(tmp_path / "out.safetensors"))
    assert set(got) == set(want)
    for k, v in want.items():
        assert _same(got[k], v), k


def test_concat_slice_and_merges_on_element_counts():
    src = SegmentSource("mem")
    parts = [Part(src, "a", 8, 3), Part(src, "b", 0, 0), Part(src, "c", 4, 5)]
    segs = concat_slice(parts, 2, 4, 2)
    assert [(s.key, s.offset, s.length) for s in segs] == [("a", 12, 2), ("c", 4, 6)]
    # ZeRO-2, 3 ranks, 10 elements -> aligned to 12, 4 per rank, the last rank stripped to 2
    placed = zero2_group([("x", (4,)), ("y", (6,))], [Part(src, f"r{r}", 0, n) for r, n in enumerate((4, 4, 2))],
                         3, 4)
    assert [(s.key, s.offset, s.length) for s in placed["y"]] == [("r1", 0, 16), ("r2", 0, 8)]
    # ZeRO-3, 2 ranks: a 3-element param is 2 + 1 (+1 padding); the next starts 2 elements in
    placed = zero3_params([("p", (3,)), ("q", (2,))], [[Part(src, "r0", 0, 3)], [Part(src, "r1", 0, 3)]], 4)
    assert [(s.key, s.offset, s.length) for s in placed["p"]] == [("r0", 0, 8), ("r1", 0, 4)]
    assert [(s.key, s.offset, s.length) for s in placed["q"]] == [("r0", 8, 4), ("r1", 8, 4)]


# ------------------------------------------------------------------ broken folders

def _copy(tmp_path: Path, run: str) -> Path:
    dst = tmp_path / run
    shutil.copytree(DS / run, dst, ignore=shutil.ignore_patterns("*.py", "*.safetensors", "*.json"))
    return dst


def test_a_missing_rank_is_one_clear_error(tmp_path, run_cli):
    run = _copy(tmp_path, "zero3_fp32")
    os.unlink(run / "global_step1" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert_one_line_error(run_cli("inspect", str(run)), "2 ranks but 1")


def test_latest_naming_a_missing_tag_is_one_clear_error(tmp_path, run_cli):
    run = _copy(tmp_path, "zero2_fp32")
    (run / "latest").write_text("global_step9")
    assert_one_line_error(run_cli("inspect", str(run)), "global_step9")


def test_a_corrupt_partition_size_is_refused(tmp_path, run_cli):
    groups = [[("w", (9,))]]
    write_zero2(tmp_path / "t", groups, 2)
    (tmp_path / "t" / "mp_rank_00_model_states.pt").unlink()
    torch.save({"module": {}, "buffer_names": [], "param_shapes": [OrderedDict(w=torch.Size([40]))]},
               tmp_path / "t" / "mp_rank_00_model_states.pt")
    assert_one_line_error(run_cli("inspect", str(tmp_path / "t")), "do not match the parameter shapes")


def test_model_parallel_ranks_are_refused(tmp_path, run_cli):
    run = _copy(tmp_path, "zero2_fp32")
    step = run / "global_step1"
    shutil.copy(step / "mp_rank_00_model_states.pt", step / "mp_rank_01_model_states.pt")
    assert_one_line_error(run_cli("inspect", str(run)), "model-parallel")


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-copy", "buffered"])
@pytest.mark.parametrize("ext", [".pth", ".safetensors"])
def test_large_params_are_copied_piece_by_piece(tmp_path, monkeypatch, ext, kernel):
    """A ZeRO-3 parameter over 3 ranks is 3 file regions, each copied on its own, CRC chained: in the kernel
    (where a region lands at its source's offset within a page) or through one buffer (elsewhere)."""
    import zipfile

    from ckpt_tool.writers import output

    spec = gt.Zero3Spec(groups=[[("big", (1501, 1399)), ("small", (3,))]], world_size=3)
    gt.write_zero3(str(tmp_path / "run"), spec)
    calls, pieces = [], []
    real, real_region = os.copy_file_range, output.copy_region

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    def region(out, r, **kwargs):
        pieces.append(r.length)
        return real_region(out, r, **kwargs)

    monkeypatch.setattr(os, "copy_file_range", counting)
    monkeypatch.setattr(output, "copy_region", region)  # the call for each piece of a joined parameter
    monkeypatch.setattr(output, "_page_aligned", lambda src_offset, fd: kernel)
    out = tmp_path / f"out{ext}"
    assert migrate(tmp_path / "run", out).ok
    assert len(pieces) >= 3 and sum(pieces) >= 1501 * 1399 * 4
    assert (sum(calls) >= 1501 * 1399 * 4) if kernel else calls == []
    got = _read_output(out)
    for k, v in gt.expected_state_dict(spec).items():
        assert _same(got[k], v), k
    if ext == ".pth":
        with zipfile.ZipFile(out) as z:
            assert z.testzip() is None
