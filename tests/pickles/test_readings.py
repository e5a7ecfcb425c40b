"""Every reading a loader could make (issue 21): each file is judged under every loader that would read it.

Real files throughout: torch.save, torch.jit.save, torch.package, np.save, safetensors, DCP's writers;
the hostile shapes come from tests/hostile/cases_readings.py (the same builders the parity harness uses).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ckpt_tool.commands.scan import scan
from ckpt_tool.formats import detect
from tests.helpers.errors import assert_one_line_error
from tests.hostile import builders as b
from tests.hostile.cases_readings import (
    legacy_magic_bytes,
    npy_bytes,
    safetensors_pickle_polyglot,
    safetensors_tar_polyglot,
)

ROOT = Path(__file__).resolve().parents[2]


def _evil(marker: Path) -> bytes:
    return b.dumps(b.Reduce(os.system, f"touch '{marker}'"))


def _dangerous(path: Path) -> set[str]:
    report = scan([str(path)])
    return {g.qualname for f in report.files for g in f.globals if g.severity == "dangerous"}


def _with_member(name: str, data: bytes) -> bytes:
    return b.py_zip([*b.zip_members(b.tsave({"w": torch.ones(2)})), (name, data)])


# ------------------------------------------------------------------ 1. polyglots


def test_safetensors_that_is_also_a_tar_is_judged_by_its_tar_reading(tmp_path, run_cli):
    path = tmp_path / "model.pth"
    path.write_bytes(safetensors_tar_polyglot(_evil(tmp_path / "ran")))
    with safe_open(str(path), "pt") as f:  # safetensors reads it as one U8 tensor
        assert list(f.keys()) == ["t"]
    assert "posix.system" in _dangerous(path)
    r = run_cli("scan", str(path))
    assert r.code == 1 and "polyglot" in r.out
    assert not (tmp_path / "ran").exists()


def test_safetensors_that_is_also_a_pickle_is_judged_by_its_pickle_reading(tmp_path, run_cli):
    path = tmp_path / "model.bin"
    path.write_bytes(safetensors_pickle_polyglot(_evil(tmp_path / "ran")))
    with safe_open(str(path), "pt") as f:  # one U8 tensor, its key the pickle's opening
        (key,) = f.keys()
        assert key.startswith("aaaaC") and f.get_tensor(key).shape == (600,)
    assert "posix.system" in _dangerous(path)
    r = run_cli("inspect", str(path))  # read as safetensors, but a .bin is torch.load's: its pickle is named
    assert r.code == 0 and "posix.system" in r.out + r.err
    assert run_cli("gate", str(path)).code == 1
    assert not (tmp_path / "ran").exists()


def test_plain_safetensors_under_a_torch_name_has_no_other_reading(tmp_path, run_cli):
    path = tmp_path / "model.bin"
    save_file({"a": torch.ones(3), "b": torch.zeros(2, 2)}, str(path))
    report = scan([str(path)])
    assert report.exit_code == 0 and not report.files[0].findings
    r = run_cli("inspect", str(path))
    assert r.code == 0 and "polyglot" not in r.out + r.err


# ------------------------------------------------------------------ 2. .npy members, every spelling


@pytest.mark.parametrize("dtype", ["O", object, [("a", "<f4"), ("b", "O")], [("a", "O", (2,))]],
                         ids=["O", "object", "structured", "subarray"])
@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_member_with_an_object_dtype_is_walked(tmp_path, dtype, version):
    arr = np.empty(1, dtype=dtype)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version, allow_pickle=True)
    header_len = buf.getvalue().index(b"\n") + 1  # np.load unpickles what follows the header
    data = buf.getvalue()[:header_len] + _evil(tmp_path / "ran")
    path = tmp_path / "with_npy.pth"
    path.write_bytes(_with_member("archive/extra/a.npy", data))
    assert "posix.system" in _dangerous(path)


@pytest.mark.parametrize("descr", ["'object'", "'|O'", "'>O8'", "[('x', '<i4'), ('y', [('z', 'O')])]"])
def test_npy_dtype_spellings_numpy_reads_as_objects(tmp_path, descr):
    data = npy_bytes(descr, _evil(tmp_path / "ran"))
    assert np.lib.format.read_array_header_1_0(io.BytesIO(data[8:]))[2].hasobject  # NumPy agrees
    path = tmp_path / "spelled.pth"
    path.write_bytes(_with_member("archive/extra/a.npy", data))
    assert "posix.system" in _dangerous(path)


def test_npz_member_and_plain_arrays(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, plain=np.arange(4.0), objs=np.array([{"k": 1}], dtype=object))
    path = tmp_path / "arrays.pth"
    path.write_bytes(_with_member("archive/extra/arrays.npz", buf.getvalue()))
    report = scan([str(path)])
    where = {g.where for f in report.files for g in f.globals}
    assert any("objs.npy (object array)" in w for w in where), where  # the object array's pickle is walked
    assert not any("plain.npy" in w for w in where)


# ------------------------------------------------------------------ 3. legacy magic, however spelled


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_legacy_files_of_every_pickle_protocol_are_read_as_torch_reads_them(tmp_path, run_cli, protocol):
    path = tmp_path / f"legacy{protocol}.pt"
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert detect.detect(str(path)) == "torch-legacy"  # the magic number, whatever opcodes spell it
    r = run_cli("inspect", "--json", str(path))
    if protocol == 0:  # protocol 0 writes persistent ids as text, which torch's legacy loader refuses
        with pytest.raises(AssertionError, match="saved_id must be a tuple"):
            torch.load(path, weights_only=False)
        assert_one_line_error(r, "persistent id")
        return
    assert r.code == 0 and [t["key"] for t in json.loads(r.out)["tensors"]] == ["w"]


@pytest.mark.parametrize("spelling", ["long4", "int_text", "proto0", "computed"])
def test_nested_legacy_file_with_another_magic_spelling_is_walked(tmp_path, spelling):
    nested = legacy_magic_bytes(spelling, _evil(tmp_path / "ran"))
    path = tmp_path / "nested.pth"
    path.write_bytes(_with_member("archive/extra/nested.pt", nested))
    assert "posix.system" in _dangerous(path)
    lfb = tmp_path / "lfb.pkl"  # the same bytes handed to torch.storage._load_from_bytes
    lfb.write_bytes(b.dumps({"w": b.Reduce(torch.storage._load_from_bytes, nested)}))
    found = [g for f in scan([str(lfb)]).files for g in f.globals if g.qualname == "posix.system"]
    assert found and "_load_from_bytes" in found[0].where


# ------------------------------------------------------------------ 4. DCP .metadata and bytes items


def _dcp_folder(tmp_path: Path, extra: object) -> Path:
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "dcp"
    dcp.save({"w": torch.arange(4.0), "extra": extra}, checkpoint_id=str(folder))
    return folder


def test_dcp_bytes_item_payload_is_named_by_inspect_gate_and_scan(tmp_path, run_cli):
    folder = _dcp_folder(tmp_path, b.Reduce(os.system, f"touch '{tmp_path / 'ran'}'"))
    r = run_cli("inspect", str(folder))
    assert r.code == 0 and "posix.system" in r.out + r.err
    assert run_cli("gate", str(folder)).code == 1
    assert run_cli("scan", str(folder)).code == 1
    assert not (tmp_path / "ran").exists()


def test_dcp_metadata_payload_is_named(tmp_path, run_cli):
    folder = _dcp_folder(tmp_path, 3)
    meta = folder / ".metadata"
    md = pickle.loads(meta.read_bytes())  # our own file, written just now by torch
    md.planner_data = {"x": b.Reduce(os.system, f"touch '{tmp_path / 'ran'}'")}
    meta.write_bytes(pickle.dumps(md))
    r = run_cli("inspect", str(folder))
    assert r.code in (0, 2) and "posix.system" in r.out + r.err
    assert run_cli("gate", str(folder)).code == 1
    assert run_cli("scan", str(meta)).code == 1


# ------------------------------------------------------------------ 5, 6. TorchScript code, torch.package


def test_torchscript_custom_operator_is_dangerous_and_aten_is_not(tmp_path, run_cli):
    if not hasattr(torch.ops.ckpt_readings, "poke"):
        torch.library.define("ckpt_readings::poke", "(Tensor x) -> Tensor")
        torch.library.impl("ckpt_readings::poke", "CPU")(lambda x: x + 1)

    class Custom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.ckpt_readings.poke(x) + torch.ops.aten.relu(x)

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    custom, plain = tmp_path / "custom.pt", tmp_path / "plain.pt"
    torch.jit.save(torch.jit.script(Custom()), str(custom))
    torch.jit.save(torch.jit.script(Plain()), str(plain))
    assert "torch.ops.ckpt_readings.poke" in _dangerous(custom)
    assert not any("torch.ops.aten" in n for n in _dangerous(custom))
    assert _dangerous(plain) == set()
    assert run_cli("gate", str(custom)).code == 1


def test_torch_package_archive_is_dangerous_and_refused(tmp_path, run_cli):
    from torch.package import PackageExporter

    src = tmp_path / "ckpt_readings_pkg.py"
    src.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    path = tmp_path / "packaged.pt"
    with PackageExporter(str(path)) as exporter:
        exporter.save_source_file("ckpt_readings_pkg", str(src))
        exporter.save_pickle("res", "state.pkl", {"w": [1.0]})
    assert "ckpt_readings_pkg.<module>" in _dangerous(path)
    assert_one_line_error(run_cli("inspect", str(path)), "torch.package")
    assert run_cli("scan", str(path)).code == 1
    assert not (tmp_path / "ran").exists()


# ------------------------------------------------------------------ 7. names that lead outside the folder


def _sharded(folder: Path) -> Path:
    folder.mkdir()
    save_file({"a": torch.ones(2)}, str(folder / "part-1.safetensors"))
    save_file({"b": torch.ones(3)}, str(folder / "part-2.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))
    return index


def test_shard_reached_through_a_symlink_outside_the_folder_is_an_error(tmp_path, run_cli):
    index = _sharded(tmp_path / "model")
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(index.parent / "part-2.safetensors", outside)
    os.symlink(outside, index.parent / "part-2.safetensors")
    assert_one_line_error(run_cli("inspect", str(index.parent)), "part-2.safetensors", "symbolic link")
    assert run_cli("scan", str(index)).code == 2
    assert run_cli("scan", str(index.parent)).code == 2
    gate = run_cli("gate", "--json", str(index.parent))
    assert gate.code != 0 and not json.loads(gate.out)["passed"]


def test_shard_inside_the_folder_through_a_symlink_is_read(tmp_path, run_cli):
    index = _sharded(tmp_path / "model")
    (index.parent / "store").mkdir()
    os.replace(index.parent / "part-2.safetensors", index.parent / "store" / "p2.safetensors")
    os.symlink("store/p2.safetensors", index.parent / "part-2.safetensors")
    assert run_cli("inspect", str(index.parent)).code == 0


def test_dcp_shard_through_a_symlink_outside_the_folder_is_an_error(tmp_path, run_cli):
    folder = _dcp_folder(tmp_path, 3)
    shard = next(folder.glob("*.distcp"))
    outside = tmp_path / "outside.distcp"
    os.replace(shard, outside)
    os.symlink(outside, shard)
    assert_one_line_error(run_cli("inspect", str(folder)), shard.name, "symbolic link")
    assert run_cli("scan", str(folder)).code == 2


def test_index_naming_a_parent_path_is_an_error_in_a_folder_scan(tmp_path, run_cli):
    index = _sharded(tmp_path / "model")
    index.write_text(json.dumps({"weight_map": {"a": "part-1.safetensors", "b": "../part-2.safetensors"}}))
    assert_one_line_error(run_cli("inspect", str(index.parent)), "outside the folder")
    r = run_cli("scan", str(index.parent))
    assert r.code == 2 and "outside the folder" in r.out + r.err


# ------------------------------------------------------------------ 8. parity: the zip folder rule, views


@pytest.mark.parametrize("position", ["last", "second"])
def test_member_outside_the_archive_folder_is_refused_like_torch(tmp_path, run_cli, position):
    members = b.zip_members(b.tsave({"w": torch.ones(2)}))
    odd = ("other/notes.txt", b"hello")
    members = [*members, odd] if position == "last" else [*members[:1], odd, *members[1:]]
    path = tmp_path / "odd.pth"
    path.write_bytes(b.py_zip(members))
    with pytest.raises(RuntimeError, match=re.escape("not in a subdirectory archive/: other/notes.txt")):
        torch.load(path, weights_only=True)
    assert_one_line_error(run_cli("inspect", str(path)), "'other/notes.txt'", "archive/")
    assert run_cli("scan", str(path)).code == 2  # unreadable, never "safe"
    evil = tmp_path / "evil.pth"
    evil.write_bytes(b.py_zip([*members, ("other/payload.pkl", _evil(tmp_path / "ran"))]))
    assert "posix.system" in _dangerous(evil)  # scan still walks every member
    gate = run_cli("gate", str(evil))
    assert gate.code in (1, 2) and "posix.system" in gate.out + gate.err


def test_view_past_its_storage_is_not_safe_to_scan(tmp_path, run_cli):
    records = b.torch_zip_records(b.tsave({"w": torch.arange(8.0)[2:]}))
    pkl = records["data.pkl"]
    at = pkl.index(b"K\x08", pkl.index(b"cpu"))  # the storage's element count, 8 -> 4
    records["data.pkl"] = pkl[:at] + b"K\x04" + pkl[at + 2:]
    records["data/0"] = records["data/0"][:16]
    path = tmp_path / "past.pth"
    path.write_bytes(b.write_torch_zip(records))
    with pytest.raises(RuntimeError):
        torch.load(path, weights_only=True)
    assert_one_line_error(run_cli("inspect", str(path)), "reaches past the end of its storage")
    report = scan([str(path)])
    assert report.files[0].verdict == "error" and report.exit_code == 2


# ------------------------------------------------------------------ 9. distributed safetensors (DCP's HF writer)


_HF_WRITER = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    def run(rank, world, out, rendezvous):
        dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        sd = {"w": distribute_tensor(torch.arange(24.0).reshape(6, 4), mesh, [Shard(0)]),
              "b": distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])}
        dcp.save(sd, storage_writer=HuggingFaceStorageWriter(out, save_distributed=True))
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
""")




def test_distributed_safetensors_rank_files_are_refused_alone(tmp_path, run_cli):
    """One rank's file is never read as whole tensors; the folder reads as the model (test_dist_safetensors.py)."""
    script = tmp_path / "hf_writer.py"
    script.write_text(_HF_WRITER)
    out = tmp_path / "hf"
    done = subprocess.run([sys.executable, str(script), str(out), f"file://{tmp_path / 'rendezvous'}"], check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) == 2
    with safe_open(str(shards[0]), "pt") as f:  # each shard holds slices: w is [3, 4] of [6, 4]
        assert "DCP_SHARDING_INFO" in (f.metadata() or {}) and list(f.get_slice("w").get_shape()) == [3, 4]
    assert_one_line_error(run_cli("inspect", str(shards[0])), "distributed safetensors", "DCP_SHARDING_INFO")
    r = run_cli("inspect", "--json", str(out))
    assert r.code == 0 and {t["key"]: t["shape"] for t in json.loads(r.out)["tensors"]} == {"w": [6, 4], "b": [4]}
    assert run_cli("diff", str(shards[0]), str(shards[1])).code == 2
    # scan asks whether loading a file can run code: each rank file is read and checked as safetensors reads it
    # (its slices as saved; no pickle): safe, as any safetensors file whose header holds
    assert run_cli("scan", str(out)).code == 0
    renamed = tmp_path / "model.safetensors"  # rank 1's slices, at nonzero offsets, whatever the name
    renamed.write_bytes(shards[1].read_bytes())
    assert_one_line_error(run_cli("inspect", str(renamed)), "distributed safetensors")


def test_rank0_save_of_the_hf_writer_is_read_as_whole_tensors(tmp_path, run_cli):
    """save_distributed=False writes DCP_SHARDING_INFO too (every offset zero) beside an index: a model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    out = tmp_path / "hf"
    with pytest.warns(UserWarning):  # "torch.distributed is disabled ... assuming ... a single process"
        dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, storage_writer=HuggingFaceStorageWriter(str(out)))
    (shard,) = out.glob("*.safetensors")
    with safe_open(str(shard), "pt") as f:
        assert "DCP_SHARDING_INFO" in (f.metadata() or {})
    r = run_cli("inspect", "--json", str(out))
    assert r.code == 0 and [(t["key"], t["shape"]) for t in json.loads(r.out)["tensors"]] == [("w", [2, 3])]


def test_torch_zip_reader_rule_matches_torch_for_a_real_archive(tmp_path):
    """Every member torch.save writes lies in its folder: the rule refuses nothing torch reads."""
    path = tmp_path / "ok.pth"
    torch.save({"w": torch.ones(2), "opt": {"lr": 0.1}}, path)
    with zipfile.ZipFile(path) as z:
        prefix = z.namelist()[0].split("/")[0] + "/"
        assert all(n.startswith(prefix) for n in z.namelist())
    assert scan([str(path)]).exit_code == 0


def test_torchscript_custom_class_outside_torchs_namespaces_is_dangerous(tmp_path):
    model = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(4, 4)), {torch.nn.Linear},
                                                   dtype=torch.qint8)
    real = tmp_path / "quantized_script.pt"
    torch.jit.save(torch.jit.script(model), str(real))
    assert not any("torch.classes" in n for n in _dangerous(real))  # torch's own packed-params class
    members = [(n, d.replace(b"__torch__.torch.classes.quantized\n", b"__torch__.torch.classes.evilns\n")
                if n.endswith("data.pkl") else d) for n, d in b.zip_members(real.read_bytes())]
    renamed = tmp_path / "custom_class.pt"
    renamed.write_bytes(b.py_zip(members))
    assert "__torch__.torch.classes.evilns.LinearPackedParamsBase" in _dangerous(renamed)


def test_dcp_metadata_given_alone_walks_the_files_it_names(tmp_path, run_cli):
    folder = _dcp_folder(tmp_path, b.Reduce(os.system, f"touch '{tmp_path / 'ran'}'"))
    report = scan([str(folder / ".metadata")])
    assert {os.path.basename(f.path) for f in report.files} >= {".metadata", next(folder.glob("*.distcp")).name}
    assert report.exit_code == 1 and any(g.qualname == "posix.system" for f in report.files for g in f.globals)


def test_no_safetensors_header_length_reads_as_a_pickle_that_names_anything(tmp_path):
    """Whatever byte a header length starts with (a pickle opcode or not), a plain file stays safe."""
    data = torch.arange(64, dtype=torch.float32).numpy().tobytes() + b"\n".join([b"cos", b"system"]) * 4
    base = {"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]},
            "__metadata__": {"format": "pt"}}
    text = json.dumps(base, separators=(",", ":")).encode()
    paths = []
    for low in range(256):
        n = 512 + low if 512 + low >= len(text) else 768 + low
        path = tmp_path / f"h{low:03d}.bin"
        path.write_bytes(len(text.ljust(n)).to_bytes(8, "little") + text.ljust(n) + data)
        paths.append(path)
    with safe_open(str(paths[0x63]), "pt") as f:  # 'c' (GLOBAL) as the first byte: still plain safetensors
        assert list(f.keys()) == ["w"]
    report = scan([str(p) for p in paths])
    assert report.exit_code == 0
    assert [f.path for f in report.files if f.verdict != "safe" or f.findings] == []


def test_scripted_quantized_model_lists_what_torch_jit_load_lists(tmp_path, run_cli):
    """Packed params are a C++ class with no code/ source: torch.jit.load reads the archive, and so does ckpt."""
    model = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
                                                                       torch.nn.Linear(4, 2)),
                                                   {torch.nn.Linear}, dtype=torch.qint8)
    path = tmp_path / "scripted_quantized.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    expected = sorted(torch.jit.load(str(path)).state_dict())
    r = run_cli("inspect", "--json", str(path))
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert sorted(t["key"] for t in doc["tensors"]) == expected
    packed = [w for w in doc["warnings"] if "packed params" in w]
    assert packed and "0._packed_params._packed_params" in packed[0] and "2._packed_params" in packed[0]
