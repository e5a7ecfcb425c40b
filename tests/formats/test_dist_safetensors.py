"""torch's distributed Hugging Face safetensors (HuggingFaceStorageWriter(save_distributed=True)), consolidated.

Two gloo processes save DTensors (Shard(0), Shard(1), an uneven split, a
replicated tensor, bf16 and int64) with torch's own writer; the folder must
read as the model (shapes from the headers alone) and migrate must write
what torch's consolidate_safetensors_files writes, bit for bit.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers.bits import assert_bit_equal
from tests.helpers.errors import assert_one_line_error

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dist_safetensors"  # fixtures/dist_safetensors/generate.py


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """torch's writer's output, committed: ``one`` (a file per rank), ``two`` (two files per rank), ``full.pt``
    (every DTensor's full_tensor(), the consolidated model)."""
    root = tmp_path_factory.mktemp("dist_st")
    shutil.copytree(FIXTURE / "run", root / "one")
    shutil.copytree(FIXTURE / "run_two", root / "two")
    torch.save(st.load_file(str(FIXTURE / "expected.safetensors")), root / "full.pt")
    return root


_same = assert_bit_equal


def test_each_rank_file_holds_slices(saved):
    """What the test relies on: torch's writer put slices, placed by DCP_SHARDING_INFO, in 2 rank files."""
    files = sorted((saved / "one").glob("*.safetensors"))
    assert [f.name for f in files] == ["shard-00001-model-00001-of-00001.safetensors",
                                       "shard-00002-model-00001-of-00001.safetensors"]
    from safetensors import safe_open

    with safe_open(str(files[1]), "pt") as f:
        info = json.loads(f.metadata()["DCP_SHARDING_INFO"])
        assert f.get_slice("proj.weight").get_shape() == [4, 3] and info["proj.weight"]["saved_offsets"] == [0, 4]


@pytest.mark.parametrize("folder", ["one", "two"])
def test_inspect_shows_the_consolidated_model_from_headers(saved, folder, run_cli):
    full = torch.load(saved / "full.pt", weights_only=True)
    r = run_cli("inspect", "--json", str(saved / folder))
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["format"] == "distributed-safetensors"
    assert {t["key"]: (t["dtype"], t["shape"]) for t in doc["tensors"]} == {
        k: (str(v.dtype).removeprefix("torch."), list(v.shape)) for k, v in full.items()}
    ck = load(saved / folder)
    assert ck.metadata["distributed_safetensors"]["ranks"] == 2


def _torch_consolidated(src: Path, out: Path, keys: list[str]) -> dict:
    """torch's own consolidation (it sizes dtypes with torch.finfo: float tensors only)."""
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files

    out.mkdir()
    consolidate_safetensors_files(str(src), str(out), dict.fromkeys(keys, 1))
    return st.load_file(str(out / "model-00001-of-00001.safetensors"))


@pytest.mark.parametrize("folder", ["one", "two"])
def test_the_rank_count_nobody_recorded_is_said(saved, folder, run_cli):
    # a missing last rank cannot be told from the headers: the report says how many it found, never silence
    doc = json.loads(run_cli("inspect", "--json", str(saved / folder)).out)
    assert any("records no rank count" in w and "2 rank" in w for w in doc["warnings"]), doc["warnings"]


@pytest.mark.parametrize("folder", ["one", "two"])
def test_migrate_equals_torchs_consolidate_bit_for_bit(saved, folder, tmp_path):
    full = torch.load(saved / "full.pt", weights_only=True)
    floats = [k for k, v in full.items() if v.is_floating_point()]
    want = _torch_consolidated(saved / folder, tmp_path / "torch", floats)
    out = tmp_path / "model.safetensors"
    report = migrate(saved / folder, out)
    assert report.ok and report.written
    got = st.load_file(str(out))
    _same({k: got[k] for k in floats}, want)
    _same(got, full)  # and every tensor, int64 included, equals DTensor.full_tensor()


def test_pth_output_and_workers_write_the_same_tensors(saved, tmp_path):
    full = torch.load(saved / "full.pt", weights_only=True)
    assert migrate(saved / "one", tmp_path / "m.pth").ok
    _same(torch.load(tmp_path / "m.pth", weights_only=True), full)
    assert migrate(saved / "two", tmp_path / "a.safetensors", workers=1).ok
    assert migrate(saved / "two", tmp_path / "b.safetensors", workers=2).ok
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_one_rank_file_is_refused_naming_the_folder(saved, run_cli):
    rank = saved / "one" / "shard-00002-model-00001-of-00001.safetensors"
    assert_one_line_error(run_cli("inspect", str(rank)), "one rank's file", f"ckpt inspect {saved / 'one'}")
    assert run_cli("migrate", str(rank), "-o", str(saved / "never.safetensors")).code == 2
    assert not (saved / "never.safetensors").exists()


def _rewrite(path: Path, key: str, offsets: list[int]) -> None:
    """Give ``key`` other saved_offsets in one rank file (the rest of the file as torch wrote it)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    info = json.loads(meta["DCP_SHARDING_INFO"])
    info[key]["saved_offsets"] = offsets
    st.save_file(tensors, str(path), metadata={**meta, "DCP_SHARDING_INFO": json.dumps(info)})


@pytest.mark.parametrize("offsets,why", [([4, 0], "elements are in no slice"), ([2, 0], "two slices overlap")])
def test_slices_that_do_not_tile_the_tensor_are_an_error(saved, tmp_path, offsets, why, run_cli):
    """Rank 1's rows of embed.weight moved down (a gap of zeros in torch's output) or up (two ranks' rows)."""
    bad = tmp_path / "bad"
    shutil.copytree(saved / "one", bad)
    _rewrite(bad / "shard-00002-model-00001-of-00001.safetensors", "embed.weight", offsets)
    for cmd in ("inspect", "migrate"):
        args = [cmd, str(bad)] + (["-o", str(tmp_path / "x.safetensors")] if cmd == "migrate" else [])
        assert_one_line_error(run_cli(*args), "'embed.weight' do not tile", why)
    assert not (tmp_path / "x.safetensors").exists()


def test_a_missing_rank_and_a_foreign_file_are_errors(saved, tmp_path, run_cli):
    gap = tmp_path / "gap"
    gap.mkdir()
    for n in (1, 3):  # rank 2 of 3 missing
        shutil.copy(saved / "one" / "shard-00001-model-00001-of-00001.safetensors",
                    gap / f"shard-0000{n}-model-00001-of-00001.safetensors")
    assert_one_line_error(run_cli("inspect", str(gap)), "rank(s) 00002 are missing")
    foreign = tmp_path / "foreign"
    shutil.copytree(saved / "one", foreign)
    st.save_file({"x": torch.ones(2)}, str(foreign / "extra.safetensors"))
    assert_one_line_error(run_cli("inspect", str(foreign)), "extra.safetensors has no DCP_SHARDING_INFO")


def _header(path: Path) -> tuple[dict, dict]:
    import struct

    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    return header, meta


def test_the_benchmarks_generator_writes_what_torchs_writer_writes(saved, tmp_path):
    """benchmarks/generate_dist_safetensors.py against the gloo save: names, metadata keys, slices, offsets."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import generate_dcp
    import generate_dist_safetensors

    shard0 = ["embed.weight", "norm.weight", "steps"]  # the save's Shard(0) tensors
    full = torch.load(saved / "full.pt", weights_only=True)
    spec = generate_dcp.DcpSpec([(k, tuple(full[k].shape), full[k].dtype) for k in shard0], 2)
    generate_dist_safetensors.write_dist_safetensors(str(tmp_path / "gen"), spec)
    real = sorted((saved / "one").glob("*.safetensors"))
    made = sorted((tmp_path / "gen").glob("*.safetensors"))
    assert [p.name for p in made] == [p.name for p in real]
    for r, m in zip(real, made, strict=True):
        (rh, rm), (mh, mm) = _header(r), _header(m)
        assert set(mm) == set(rm)
        rinfo, minfo = json.loads(rm["DCP_SHARDING_INFO"]), json.loads(mm["DCP_SHARDING_INFO"])
        for k in shard0:
            assert (mh[k]["dtype"], mh[k]["shape"], minfo[k]) == (rh[k]["dtype"], rh[k]["shape"], rinfo[k]), k
    ck = load(tmp_path / "gen")
    assert {t.key: t.shape for t in ck.tensors} == {k: tuple(full[k].shape) for k in shard0}
