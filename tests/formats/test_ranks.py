"""Per-rank torch.save files of DTensor and ShardedTensor state dicts, consolidated (issue 24).

fixtures/ranks/ holds folders 2 (mesh2d: 4) gloo processes wrote (fixtures/ranks/generate.py):
verl's ``model_world_size_2_rank_K.pt`` of a real FSDP2 model, the same model
plus tensor-parallel ``Shard(1)``/``Shard(2)``, ``Replicate()`` and plain
tensors under arbitrary names, FSDP1 ``SHARDED_STATE_DICT`` (ShardedTensor),
HSDP and 2-d tensor-parallel splits on a (2, 2) mesh,
and broken sets; beside each good folder ``D``, ``D.expected.pt`` is what the
same run computed with ``DTensor.full_tensor()`` (FSDP1: its gathered
``FULL_STATE_DICT``), saved by rank 0.
"""
from __future__ import annotations

import shutil
import zipfile

import pytest
from conftest import ROOT

from tests.helpers.bits import bits
from tests.helpers.errors import assert_one_line_error

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from ckpt_tool import load  # noqa: E402
from ckpt_tool.commands.migrate import migrate  # noqa: E402
from ckpt_tool.format_names import Format  # noqa: E402
from ckpt_tool.formats.detect import detect  # noqa: E402

RANKS = ROOT / "fixtures" / "ranks"
GOOD = ["verl", "fsdp2_tp", "fsdp1", "mesh2d", "tp2d"]


def _expected(name):
    return torch.load(RANKS / f"{name}.expected.pt", weights_only=True)


def assert_same(want: dict, got: dict) -> None:
    assert list(got) == list(want)
    for k, a in want.items():
        b = got[k]
        assert (a.dtype, tuple(a.shape)) == (b.dtype, tuple(b.shape)), k
        assert torch.equal(bits(a), bits(b)), k


@pytest.mark.parametrize("name", GOOD)
def test_detected_from_the_pickles_and_listed_from_metadata(name):
    assert detect(str(RANKS / name)) == Format.RANKS
    ck = load(RANKS / name)
    want = _expected(name)
    assert ck.format == Format.RANKS
    assert [(t.key, t.dtype, t.shape) for t in ck.tensors] == [
        (k, str(v.dtype).removeprefix("torch."), tuple(v.shape)) for k, v in want.items()]
    assert ck.metadata["ranks"]["world_size"] == (4 if name in ("mesh2d", "tp2d") else 2)


@pytest.mark.parametrize("name", GOOD)
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_migrate_equals_full_tensor_bit_for_bit(name, suffix, tmp_path):
    out = tmp_path / f"out{suffix}"
    report = migrate(RANKS / name, out)
    assert report.ok and report.written
    got = st.load_file(out) if suffix == ".safetensors" else torch.load(out, weights_only=True)
    assert_same(_expected(name), got)


def test_tensor_parallel_placements_are_what_the_run_saved():
    ck = load(RANKS / "fsdp2_tp")
    placed = ck.metadata["ranks"]["placements"]
    assert placed["[Shard(1)]"] == 1 and placed["[Shard(2)]"] == 1 and placed["[Replicate()]"] == 1
    assert placed["[Shard(0)]"] == 6 and placed["tensor"] == 2  # FSDP2's parameters; the buffer and the step


def test_a_two_dimensional_mesh_hsdp_and_two_cuts_of_one_dimension():
    ck = load(RANKS / "mesh2d")  # 4 ranks on a (2, 2) mesh
    meta = ck.metadata["ranks"]
    assert meta["mesh"] == [2, 2] and meta["world_size"] == 4
    assert {"[Replicate(), Shard(0)]", "[Shard(0), Shard(1)]", "[Shard(1), Shard(1)]",
            "[Replicate(), Replicate()]"} <= set(meta["placements"])


def test_fsdp2_over_tensor_parallel_strided_shards_and_a_sub_mesh():
    """torchtitan's composition (tp, then FSDP2 over dp): column-parallel weights are saved [_StridedShard(0),
    Shard(0)] (one 6-row weight splits 2 + 1 under each tp half), the norm lies on the dp sub-mesh only; the
    consolidation equals full_tensor() of the 4-process gloo run (test_migrate_equals_full_tensor_bit_for_bit)."""
    ck = load(RANKS / "tp2d")
    meta = ck.metadata["ranks"]
    assert meta["mesh"] == [2, 2] and meta["world_size"] == 4
    assert meta["placements"]["[_StridedShard(dim=0, split_factor=2), Shard(0)]"] == 5
    assert meta["placements"]["[Shard(0), Shard(1)]"] == 1 and meta["placements"]["[Shard(0)]"] == 2


def test_the_rank_comes_from_the_pickle_not_the_file_name():
    # b.pt was written by rank 0, a.pt by rank 1: read in name order, the rows would be swapped
    assert load(RANKS / "fsdp2_tp").metadata["ranks"]["files"] == ["b.pt", "a.pt"]


def test_verl_other_files_are_left_out_and_said():
    ck = load(RANKS / "verl")
    assert ck.metadata["ranks"]["layout"] == "verl"
    assert any("optim_world_size_2_rank_0.pt" in w and "not read" in w for w in ck.warnings)


def test_parallel_workers_write_the_same_bytes(tmp_path):
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    assert migrate(RANKS / "fsdp2_tp", one, workers=1).ok
    assert migrate(RANKS / "fsdp2_tp", two, workers=2).ok
    assert one.read_bytes() == two.read_bytes()


def _scramble_storages(folder):
    """Overwrite every tensor byte of every rank file in place (same sizes; the pickles untouched)."""
    for f in folder.iterdir():
        with zipfile.ZipFile(f) as z:
            members = [(i.header_offset, i.filename, i.file_size) for i in z.infolist() if "/data/" in i.filename]
        with open(f, "r+b") as fh:
            for header, _name, size in members:
                fh.seek(header + 26)
                n, extra = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
                fh.seek(header + 30 + n + extra)
                fh.write(b"\xa5" * size)


def test_inspect_reads_no_tensor_byte(tmp_path, run_cli):
    copy = tmp_path / "fsdp2_tp"
    shutil.copytree(RANKS / "fsdp2_tp", copy)
    _scramble_storages(copy)
    before = run_cli("inspect", "--json", str(RANKS / "fsdp2_tp"))
    after = run_cli("inspect", "--json", str(copy))
    assert before.code == after.code == 0
    assert after.out.replace(str(copy), "X") == before.out.replace(str(RANKS / "fsdp2_tp"), "X")
    out = tmp_path / "o.safetensors"  # the scrambling reached the tensors: their data is now 0xa5 bytes
    assert migrate(copy, out).ok
    assert set(bits(st.load_file(out)["tp.weight"]).tolist()) == {0xA5}



def test_a_missing_rank_is_one_error_line(tmp_path, run_cli):
    copy = tmp_path / "verl"
    shutil.copytree(RANKS / "verl", copy)
    (copy / "model_world_size_2_rank_1.pt").unlink()
    assert_one_line_error(run_cli("inspect", str(copy)), "rank(s) 1 of 2 missing")


def test_a_missing_rank_under_other_names_is_one_error_line(tmp_path, run_cli):
    copy = tmp_path / "fsdp1"
    shutil.copytree(RANKS / "fsdp1", copy)
    (copy / "fsdp1_rank0.pt").unlink()
    assert_one_line_error(run_cli("migrate", str(copy), "-o", str(tmp_path / "o.safetensors")),
                          "rank(s) 0 of 2 missing")
    assert not (tmp_path / "o.safetensors").exists()


def test_mismatched_keys_are_one_error_line(run_cli):
    assert_one_line_error(run_cli("inspect", str(RANKS / "bad_keys")), "do not hold the same keys", "'extra.weight'")


def test_shards_that_do_not_tile_are_one_error_line(run_cli):
    assert_one_line_error(run_cli("inspect", str(RANKS / "bad_tile")), "do not tile", "[9, 3]")


def test_overlapping_shards_are_one_error_line(run_cli):
    assert_one_line_error(run_cli("inspect", str(RANKS / "bad_overlap")), "overlap", "[0:4]", "[3:6]")


def test_replicas_that_differ_fail_the_migrate_and_leave_no_output(tmp_path, run_cli):
    out = tmp_path / "o.safetensors"
    assert run_cli("inspect", str(RANKS / "bad_replica")).code == 0  # metadata agrees; the values do not
    assert_one_line_error(run_cli("migrate", str(RANKS / "bad_replica"), "-o", str(out)), "'rep' is replicated",
                    "rank 1's copy differs from rank 0's")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,words", [("partial", ["Partial()", "reduce"]),
                                        ("strided", ["_StridedShard(dim=0, split_factor=2)",
                                                     "not one block of the global tensor"])])
def test_placements_ckpt_does_not_consolidate_are_refused(name, words, run_cli):
    assert_one_line_error(run_cli("inspect", str(RANKS / name)), *words)


def test_one_rank_file_alone_is_not_the_model():
    ck = load(RANKS / "verl" / "model_world_size_2_rank_0.pt")
    assert ck.format == Format.TORCH_ZIP and "tok.weight" not in ck.keys  # a DTensor is a record, not a tensor
    assert any("one rank's DTensor shards" in w and f"ckpt inspect {RANKS / 'verl'}" in w for w in ck.warnings)


def test_a_folder_behind_a_url_is_consolidated_the_same(tmp_path):
    from tests.helpers.remote_servers import RangeServer

    out = tmp_path / "o.safetensors"
    with RangeServer(RANKS) as server:
        report = migrate(f"{server.url}/fsdp2_tp", out)
    assert report.ok and report.written
    assert_same(_expected("fsdp2_tp"), st.load_file(out))


def test_row_pieces_are_copied_from_the_rank_files_and_other_splits_assembled():
    ck = load(RANKS / "fsdp2_tp")
    by = ck.by_key
    source = by["odd.weight"].storage.source
    pieces = source.file_pieces("odd.weight", 0, by["odd.weight"].nbytes)  # Shard(0): rank 0's rows, rank 1's
    assert pieces is not None and len(pieces) == 2 and pieces[0].length == 4 * 4 * 4
    assert source.file_pieces("tp.weight", 0, by["tp.weight"].nbytes) is None  # Shard(1): assembled
    rep = source.file_pieces("rep", 0, by["rep"].nbytes)  # replicated: one copy (the others compared first)
    assert rep is not None and len(rep) == 1 and rep[0].source.path.endswith("b.pt")  # rank 0's file
    ck.close()


def test_workers_default_to_the_cores_as_for_other_consolidations():
    from ckpt_tool.commands.migrate.parallel.choice import CONSOLIDATION_SOURCES

    assert Format.RANKS in CONSOLIDATION_SOURCES


def test_diff_with_the_full_state_dict_finds_no_difference(run_cli):
    r = run_cli("diff", str(RANKS / "fsdp2_tp"), str(RANKS / "fsdp2_tp.expected.pt"), "--values")
    assert r.code == 0 and "no differences (keys, shapes, dtypes and values)" in r.out


def test_a_truncated_rank_file_is_one_error_line(tmp_path, run_cli):
    copy = tmp_path / "fsdp2_tp"
    shutil.copytree(RANKS / "fsdp2_tp", copy)
    data = (copy / "a.pt").read_bytes()
    (copy / "a.pt").write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("migrate", str(copy), "-o", str(tmp_path / "o.safetensors")), "a.pt")
    assert not (tmp_path / "o.safetensors").exists()
