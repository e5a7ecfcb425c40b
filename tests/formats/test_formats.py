"""Every checkpoint format, written by real torch/dill/NumPy, read safely and lazily.

Each test compares what ckpt reports with what torch (or NumPy/dill) itself
loads from the same file: keys, shapes, dtypes and, where data is read, bytes.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import warnings
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch
from conftest import ROOT, run_subprocess
from torch import nn

from ckpt_tool import load
from ckpt_tool.tensors.data import tensor_bytes, to_torch
from tests.helpers.bits import raw_bytes
from tests.helpers.errors import assert_one_line_error


def torch_view(sd):
    return {k: (str(v.dtype).replace("torch.", ""), tuple(v.shape)) for k, v in sd.items()}


def ckpt_view(ckpt):
    return {t.key: (t.dtype, t.shape) for t in ckpt.tensors}


def assert_same_values(ckpt, sd):
    for t in ckpt.tensors:
        want = sd[t.key]
        got = to_torch(t)
        assert got.dtype == want.dtype and got.shape == want.shape, t.key
        # bit-exact: compare the raw bytes, not values (NaN, -0.0)
        assert raw_bytes(got) == raw_bytes(want), t.key



def mixed_state_dict():
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    return OrderedDict([
        ("w", base),
        ("w_t", base.t()),  # non-contiguous view sharing storage
        ("row", base[2]),  # view with a storage offset
        ("half", torch.randn(3, 2).half()),
        ("bf16", torch.randn(5).to(torch.bfloat16)),
        ("long", torch.arange(7)),
        ("flag", torch.tensor([True, False, True])),
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),
        ("empty", torch.zeros(0, 3)),
        ("conv", torch.randn(2, 3, 2, 2).to(memory_format=torch.channels_last)),
    ])


# --------------------------------------------------------------------- legacy


def test_legacy_fixture_matches_torch(fixtures_dir):
    path = fixtures_dir / "legacy.pth"
    real = torch.load(path, weights_only=True)
    ckpt = load(path)
    assert ckpt.format == "torch-legacy"
    assert list(ckpt.keys) == list(real)
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)


def test_legacy_layouts_shared_storage_and_dtypes(tmp_path):
    sd = mixed_state_dict()
    path = tmp_path / "mixed.pth"
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    real = torch.load(path, weights_only=True)
    ckpt = load(path)
    assert ckpt_view(ckpt) == torch_view(real)
    by_key = ckpt.by_key
    for k, v in real.items():
        assert by_key[k].stride == v.stride() and by_key[k].storage_offset == v.storage_offset(), k
    assert by_key["w"].storage_id == by_key["w_t"].storage_id == by_key["row"].storage_id
    assert_same_values(ckpt, real)


@pytest.mark.parametrize("protocol", [1, 2, 3, 4, 5])
def test_legacy_any_pickle_protocol(tmp_path, protocol):
    sd = {"a": torch.randn(2, 3), "b": torch.arange(4, dtype=torch.int32)}
    path = tmp_path / f"p{protocol}.pth"
    torch.save(sd, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = torch.load(path, weights_only=False)
    ckpt = load(path)
    assert ckpt.format == "torch-legacy"
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)


class _StorageMark:
    def __init__(self, pid):
        self.pid = pid


class _TensorMark:
    """Pickles as torch's _rebuild_tensor_v2 over a marked storage."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride)

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, (*self.args, False, OrderedDict()))


def _write_legacy(path, obj, storages):
    """The legacy layout written by hand, for records current torch no longer emits (views)."""

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            return o.pid if isinstance(o, _StorageMark) else None

    with open(path, "wb") as f:
        for header in (0x1950A86A20F9469CFC6C, 1001,
                       {"protocol_version": 1001, "little_endian": True,
                        "type_sizes": {"short": 2, "int": 4, "long": 4}}):
            pickle.dump(header, f, protocol=2)
        Pickler(f, protocol=2).dump(obj)
        pickle.dump(sorted(storages), f, protocol=2)
        for key in sorted(storages):
            data = storages[key]
            if data is None:
                continue  # the caller appends this storage itself
            f.write(struct.pack("<q", data.numel()))
            f.write(data.numpy().tobytes())


def test_legacy_storage_views_match_torch(tmp_path):
    base = torch.arange(10, dtype=torch.float32)
    root = ("storage", torch.FloatStorage, "root", "cpu", 10, None)
    view = ("storage", torch.FloatStorage, "root", "cpu", 10, ("view1", 2, 5))
    obj = OrderedDict([
        ("whole", _TensorMark(_StorageMark(root), 0, (10,), (1,))),
        ("viewed", _TensorMark(_StorageMark(view), 1, (2, 2), (2, 1))),
    ])
    path = tmp_path / "views.pth"
    _write_legacy(path, obj, {"root": base})
    real = torch.load(path, weights_only=True)
    assert real["viewed"].tolist() == [[3.0, 4.0], [5.0, 6.0]]  # torch's reading of the view record
    ckpt = load(path)
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)


def test_legacy_stays_lazy_on_a_huge_sparse_file(tmp_path):
    # 2 GiB of float32 that exist only as a hole in the file: reading them would show in RSS
    numel = 1 << 29
    pid = ("storage", torch.FloatStorage, "big", "cpu", numel, None)
    path = tmp_path / "huge.pth"
    _write_legacy(path, {"big": _TensorMark(_StorageMark(pid), 0, (numel,), (1,))}, {"big": None})
    with open(path, "ab") as f:
        f.write(struct.pack("<q", numel))
        f.truncate(f.tell() + numel * 4)
    code = (
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forked pytest parent
        "import json, sys; from ckpt_tool import load; c = load(sys.argv[1]); "
        "hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0]; "
        "print(json.dumps([c.tensors[0].key, c.tensors[0].numel, hwm, 'torch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=False, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    key, n, rss_kib, torch_imported = json.loads(out.stdout)
    assert (key, n) == ("big", numel)
    assert rss_kib < 300 * 1024  # far below the 2 GiB a read would need
    assert not torch_imported


@pytest.mark.parametrize("cut", ["in_main_pickle", "in_key_list", "before_storage", "in_storage"])
def test_truncated_legacy_is_one_line(tmp_path, run_cli, cut):
    sd = {"a": torch.randn(8), "b": torch.randn(16)}
    good = tmp_path / "good.pth"
    torch.save(sd, good, _use_new_zipfile_serialization=False)
    data = good.read_bytes()
    ends = _pickle_ends(data, 5)  # magic, protocol, sys_info, main pickle, storage keys
    at = {
        "in_main_pickle": (ends[2] + ends[3]) // 2,
        "in_key_list": ends[4] - 3,
        "before_storage": ends[4] + 8 + 8 * 4,  # after the whole first storage of 8 floats
        "in_storage": len(data) - 10,
    }[cut]
    bad = tmp_path / "cut.pth"
    bad.write_bytes(data[:at])
    with pytest.raises((EOFError, IndexError, RuntimeError, struct.error, pickle.UnpicklingError)):
        torch.load(bad, weights_only=True)  # torch refuses it too
    line = assert_one_line_error(run_cli("inspect", str(bad)))
    assert "truncated" in line and str(bad) in line


def _pickle_ends(data, count):
    import pickletools

    ends, pos = [], 0
    for _ in range(count):
        for op, _arg, at in pickletools.genops(data[pos:]):
            if op.name == "STOP":
                pos += at + 1
                break
        ends.append(pos)
    return ends


def test_tar_legacy_format_reads_as_torch_loads_it(tmp_path, run_cli):
    # torch <= 0.1.x wrote a tar of sys_info/pickle/storages/tensors; torch 2.x still reads it
    # (weights_only=False), so ckpt reads it statically, and names the advisory its shape matches.
    from hostile.builders import legacy_tar

    path = tmp_path / "old.tar"
    path.write_bytes(legacy_tar({"w": [1.0, 2.0, 3.0], "b": [0.5]}))
    expected = torch.load(path, weights_only=False)
    r = run_cli("inspect", str(path), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["format"] == "torch-tar"
    assert {t["key"]: t["shape"] for t in doc["tensors"]} == {k: list(v.shape) for k, v in expected.items()}
    assert any("CVE-2025-32434" in w for w in doc["warnings"])
    out = tmp_path / "new.safetensors"
    assert run_cli("migrate", str(path), "-o", str(out)).code == 0
    from safetensors.torch import load_file

    got = load_file(out)
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_tar_without_its_members_is_refused(tmp_path, run_cli):
    path = tmp_path / "old.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("sys_info", "pickle", "storages", "tensors"):
            data = pickle.dumps(0, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    line = assert_one_line_error(run_cli("inspect", str(path)))
    assert "storage views" in line or "not a readable pickle" in line


# ---------------------------------------------------------------- TorchScript


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("np_buf", torch.ones(3), persistent=False)
        self.p = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))

    def forward(self, x):
        return self.bn(self.lin(x)) + self.p.sum() + self.np_buf.sum()


class _Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4)))
        self.md = nn.ModuleDict({"a": nn.Embedding(5, 4), "b": nn.LayerNorm(4)})
        self.empty = nn.Identity()
        self.hlin = nn.Linear(4, 4).half()
        self.register_buffer("idx", torch.arange(5))

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        return self.seq(x) + self.md["b"](self.md["a"](self.idx)).sum() + self.hlin(x.half()).float()


def _scripted(kind):
    torch.manual_seed(0)
    if kind == "script_nested":
        return torch.jit.script(_Deep())
    if kind == "trace_nested":
        return torch.jit.trace(_Deep().eval(), torch.randn(3, 4))
    if kind == "script_gru":
        return torch.jit.script(nn.GRU(3, 4, num_layers=2))
    return torch.jit.script(nn.TransformerEncoderLayer(8, 2, 16))


@pytest.mark.parametrize("kind", ["script_nested", "trace_nested", "script_gru", "script_transformer"])
def test_torchscript_matches_jit_load(tmp_path, kind):
    path = tmp_path / f"{kind}.pt"
    torch.jit.save(_scripted(kind), path)
    real = torch.jit.load(path).state_dict()
    ckpt = load(path)
    assert ckpt.format == "torchscript" and ckpt.layout == "torchscript"
    assert list(ckpt.keys) == list(real)  # TorchScript keeps non-persistent buffers, and so do we
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)


def test_torchscript_fixture_summary_says_torchscript(fixtures_dir, run_cli):
    r = run_cli("inspect", str(fixtures_dir / "torchscript.pt"))
    assert r.code == 0
    assert "TorchScript" in r.out


@pytest.mark.parametrize("drop", ["code", "data", "data.pkl"])
def test_torchscript_missing_member_is_one_line(tmp_path, fixtures_dir, run_cli, drop):
    src = zipfile.ZipFile(fixtures_dir / "torchscript.pt")
    names = src.namelist()
    victim = {
        "code": next(n for n in names if n.endswith("code/__torch__/models.py")),
        "data": next(n for n in names if n.endswith("/data/2")),
        "data.pkl": next(n for n in names if n.endswith("/data.pkl")),
    }[drop]
    bad = tmp_path / "broken.pt"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as out:
        for name in names:
            if name != victim:
                out.writestr(name, src.read(name))
    line = assert_one_line_error(run_cli("inspect", str(bad)))
    assert "missing" in line or "no 'torchscript/data.pkl'" in line
    assert str(bad) in line


# ----------------------------------------------------------- pickle and NumPy


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_pickle_dtypes_and_values(tmp_path, protocol):
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64_fortran": np.asfortranarray(rng.standard_normal((3, 2))),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "u16": np.arange(4, dtype=np.uint16),
        "u32": np.arange(4, dtype=np.uint32),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "b": np.array([True, False]),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.array(2.5, dtype=np.float32),
    }
    path = tmp_path / f"np{protocol}.pkl"
    with open(path, "wb") as f:
        pickle.dump(arrays, f, protocol=protocol)
    ckpt = load(path)
    assert ckpt.format == "pickle"
    expected = {k: (str(torch.from_numpy(v.copy(order="C")).dtype)[6:], v.shape) for k, v in arrays.items()}
    assert ckpt_view(ckpt) == expected
    for t in ckpt.tensors:
        want = arrays[t.key].copy(order="C")
        assert tensor_bytes(t) == want.tobytes(), t.key
        assert torch.equal(to_torch(t), torch.from_numpy(want)), t.key


def test_numpy_fixture_and_non_numeric_arrays_are_metadata(tmp_path, fixtures_dir):
    ckpt = load(fixtures_dir / "numpy_dict.pkl")
    real = torch.load(fixtures_dir / "tiny_mlp.pth", weights_only=True)
    assert ckpt_view(ckpt) == torch_view(real)
    path = tmp_path / "mixed.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"w": np.ones((2, 2), np.float32)}, "classes": np.array(["cat", "dog"]),
                     "objs": np.array([{"a": 1}, None], dtype=object), "epoch": 4}, f)
    ckpt = load(path)
    assert ckpt.state_dict_key == "model" and ckpt.keys == ["w"]
    assert ckpt.metadata["classes"] == "<ndarray <U3 [2]>"
    assert ckpt.metadata["objs"] == "<ndarray object [2]>"
    assert ckpt.metadata["epoch"] == 4


def test_plain_pickle_of_torch_tensors(tmp_path):
    sd = mixed_state_dict()
    path = tmp_path / "tensors.pkl"
    with open(path, "wb") as f:
        pickle.dump(sd, f)  # each storage becomes torch.storage._load_from_bytes(<torch.save bytes>)
    real = pickle.loads(path.read_bytes())
    ckpt = load(path)
    assert ckpt.format == "pickle"
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)
    names = {r.qualname for r in ckpt.references}
    assert "torch.storage._load_from_bytes" in names
    assert "torch.FloatStorage" in names  # reported from inside the nested torch.save bytes
    assert not ckpt.dangerous


def test_nested_tensor_trees_are_flattened_like_state_dict_keys(tmp_path):
    tree = {"params": {"enc": {"kernel": np.ones((2, 3), np.float32), "bias": np.zeros(3, np.float32)},
                       "layers": [{"w": np.ones(2)}, {"w": np.zeros(2)}]},
            "step": 7}
    path = tmp_path / "tree.pkl"
    with open(path, "wb") as f:
        pickle.dump(tree, f)
    ckpt = load(path)
    assert ckpt.state_dict_key == "params"
    assert ckpt.keys == ["enc.kernel", "enc.bias", "layers.0.w", "layers.1.w"]
    assert [c.key for c in ckpt.candidates] == ["params"]
    assert ckpt.metadata["step"] == 7


@pytest.mark.parametrize("settings", [{}, {"recurse": True}, {"byref": True}])
def test_dill_dict_with_arrays_lambdas_and_namedtuples(tmp_path, settings):
    import collections

    import dill

    point = collections.namedtuple("Point", "x y")
    obj = {"w": torch.randn(2, 2), "n": np.arange(3, dtype=np.float16), "fn": lambda x: x * 2,
           "pt": point(1, 2), "epoch": 3}
    path = tmp_path / "d.dill"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with open(path, "wb") as f:
            dill.dump(obj, f, **settings)
    ckpt = load(path)
    assert ckpt.format == "dill"
    assert ckpt_view(ckpt) == {"w": ("float32", (2, 2)), "n": ("float16", (3,))}
    assert tensor_bytes(ckpt.by_key["n"]) == obj["n"].tobytes()
    assert torch.equal(to_torch(ckpt.by_key["w"]), obj["w"])
    assert ckpt.metadata["epoch"] == 3 and {"fn", "pt"} <= set(ckpt.metadata)  # inert placeholders


def test_dill_fixture_module_with_lambda(fixtures_dir):
    ckpt = load(fixtures_dir / "dill_model.dill")
    assert ckpt.format == "dill"
    assert ckpt.layout == "module"
    assert ckpt.keys == ["fc.weight", "fc.bias"]  # "tmp" is a non-persistent buffer
    assert ckpt.metadata["__class__"] == "__main__.DillNet"
    assert ckpt_view(ckpt) == {"fc.weight": ("float32", (2, 3)), "fc.bias": ("float32", (2,))}


# ------------------------------------- whole models from __main__, fresh process

WRITER = r'''
import json, os, pickle, sys
import torch
from torch import nn

folder = sys.argv[1]


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker + ".reduce",))


class Net(nn.Module):
    def __init__(self, marker, with_lambda):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
        self.head = nn.Linear(3, 2, bias=False)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("tmp", torch.ones(5), persistent=False)
        self.marker = marker
        self.evil = Evil(marker)
        if with_lambda:
            self.act = lambda x: x * 2  # only dill can pickle this

    def __setstate__(self, state):
        import torch.nn  # the loading process's globals are not this script's

        open(state["marker"] + ".setstate", "w").close()
        torch.nn.Module.__setstate__(self, state)


def model(kind):
    torch.manual_seed(0)
    return Net(os.path.join(folder, "EXECUTED-" + kind), kind.startswith("dill"))


for kind in ("torch-zip", "torch-legacy", "pickle", "dill", "dill-unsafe"):
    out = os.path.join(folder, "model." + kind)
    if kind == "torch-zip":
        torch.save(model(kind), out)
    elif kind == "torch-legacy":
        torch.save(model(kind), out, _use_new_zipfile_serialization=False)
    elif kind == "pickle":
        with open(out, "wb") as f:
            pickle.dump(model(kind), f)
    else:
        import dill
        with open(out, "wb") as f:
            dill.dump(model(kind), f)
print(json.dumps([[k, str(v.dtype)[6:], list(v.shape)] for k, v in model("x").state_dict().items()]))
'''


@pytest.fixture(scope="module")
def main_models(tmp_path_factory):
    """Whole models of a class defined in a training script's __main__, in every pickle format."""
    folder = tmp_path_factory.mktemp("main_models")
    script = folder / "train.py"
    script.write_text(WRITER)
    w = subprocess.run([sys.executable, str(script), str(folder)], check=False, capture_output=True, text=True,
                       timeout=120)
    assert w.returncode == 0, w.stderr
    expected = json.loads(w.stdout)
    assert "tmp" not in [k for k, _, _ in expected]  # a non-persistent buffer
    workdir = folder / "elsewhere"
    workdir.mkdir()  # processes started here cannot import train.py's Net
    return folder, workdir, expected


@pytest.mark.parametrize("kind", ["torch-zip", "torch-legacy", "pickle", "dill"])
def test_whole_model_from_main_in_a_fresh_process_runs_nothing(main_models, kind):
    folder, workdir, expected = main_models
    r = run_subprocess("inspect", str(folder / f"model.{kind}"), "--json", cwd=str(workdir))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == kind
    assert doc["layout"] == "module"
    assert [[t["key"], t["dtype"], t["shape"]] for t in doc["tensors"]] == expected
    assert doc["metadata"]["__class__"] == "__main__.Net"
    assert any("NOT executed" in w and "system" in w for w in doc["warnings"])
    assert not list(folder.glob(f"EXECUTED-{kind}*"))  # neither __setstate__ nor os.system ran


def test_unsafe_dill_really_runs_the_file(main_models, run_cli):
    """The marker check above can fail: --unsafe (real dill) runs the same kind of file's code."""
    folder, _, expected = main_models
    r = run_cli("inspect", str(folder / "model.dill-unsafe"), "--json", "--unsafe")
    assert r.code == 0, r
    assert [[t["key"], t["dtype"], t["shape"]] for t in json.loads(r.out)["tensors"]] == expected
    assert (folder / "EXECUTED-dill-unsafe.setstate").exists()
    assert (folder / "EXECUTED-dill-unsafe.reduce").exists()


@pytest.mark.parametrize("name", ["tiny_mlp.pth", "legacy.pth", "torchscript.pt", "numpy_dict.pkl",
                                  "dill_model.dill", "lightning.ckpt"])
def test_unsafe_load_agrees_with_the_safe_reader(fixtures_dir, name):
    safe = load(fixtures_dir / name)
    unsafe = load(fixtures_dir / name, unsafe=True)
    assert unsafe.format == safe.format
    assert unsafe.state_dict_key == safe.state_dict_key
    assert list(unsafe.keys) == list(safe.keys)
    assert ckpt_view(unsafe) == ckpt_view(safe)
    for a, b in zip(safe.tensors, unsafe.tensors, strict=True):
        assert tensor_bytes(a) == tensor_bytes(b), a.key
    assert any("--unsafe" in w for w in unsafe.warnings)


# ------------------------------------------------------------------------ DCP


def _dcp_save(state, folder, **writer):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, storage_writer=FileSystemWriter(str(folder), **writer))


def _dcp_real(folder, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / "converted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(folder), str(out))
    return torch.load(out, weights_only=False)


def test_dcp_matches_torch_and_keeps_nesting(tmp_path):
    torch.manual_seed(0)
    model = {"enc.weight": torch.randn(4, 3), "enc.bias": torch.zeros(4, dtype=torch.bfloat16),
             "steps": torch.tensor(5)}
    state = {"model": model, "step": 12, "cfg": {"lr": 0.1, "name": "run"}}
    folder = tmp_path / "ckpt"
    _dcp_save(state, folder)
    real = _dcp_real(folder, tmp_path)
    ckpt = load(folder, read_values=True)
    assert ckpt.format == "dcp"
    assert ckpt.state_dict_key == "model"
    assert ckpt_view(ckpt) == torch_view(real["model"])
    assert list(ckpt.keys) == list(real["model"])
    assert {"step", "cfg"} <= set(ckpt.metadata)
    # non-tensor entries are read on request (small torch.save blobs), as dcp_to_torch_save keeps them
    assert ckpt.metadata["step"] == real["step"] and ckpt.metadata["cfg"] == real["cfg"]
    assert str(load(folder).metadata["step"]).startswith("<bytes item: ")  # a metadata answer reads none
    assert_same_values(ckpt, real["model"])


def test_dcp_inspected_from_metadata_alone(tmp_path, run_cli):
    folder = tmp_path / "ckpt"
    _dcp_save({"model": {"w": torch.randn(3, 4), "b": torch.randn(4)}}, folder)
    real = _dcp_real(folder, tmp_path)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in os.listdir(folder):
        if name.endswith(".distcp"):
            os.rename(folder / name, hidden / name)  # no shard file can be opened
    r = run_cli("inspect", str(folder), "--json")
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert {t["key"]: (t["dtype"], tuple(t["shape"])) for t in doc["tensors"]} == torch_view(real["model"])
    assert any("metadata only" in w for w in doc["warnings"])
    line = assert_one_line_error(run_cli("inspect", str(folder), "--stats"))
    assert "__0_0.distcp" in line and "missing" in line


def test_dcp_missing_one_shard_or_metadata_is_one_line(tmp_path, run_cli):
    folder = tmp_path / "ckpt"
    _dcp_save({"model": {"a": torch.randn(3), "b": torch.randn(4), "c": torch.randn(5)}}, folder, thread_count=2)
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))
    assert len(shards) == 2
    os.remove(folder / shards[1])
    line = assert_one_line_error(run_cli("inspect", str(folder)))
    assert shards[1] in line and "missing" in line
    # the metadata file given directly still lists everything
    r = run_cli("inspect", str(folder / ".metadata"))
    assert r.code == 0 and "metadata only" in r.out
    os.remove(folder / ".metadata")
    line = assert_one_line_error(run_cli("inspect", str(folder)))
    assert ".metadata" in line


def test_dcp_multi_chunk_tensors_assembled_like_dcp_load(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    torch.manual_seed(0)
    full = {"m": torch.randn(4, 6), "t": torch.randn(2, 5, 3).to(torch.float16)}
    splits = {  # (offsets, sizes) per chunk; together they tile the tensor
        "m": [((0, 0), (4, 2)), ((0, 2), (1, 4)), ((1, 2), (3, 4))],
        "t": [((0, 0, 0), (2, 2, 3)), ((0, 2, 0), (2, 3, 3))],
    }
    folder = tmp_path / "chunks"
    folder.mkdir()
    sdm, storage = {}, {}
    with open(folder / "__0_0.distcp", "wb") as f:
        for key, chunks in splits.items():
            metas = []
            for offsets, sizes in chunks:
                piece = full[key][tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=True))].clone()
                start = f.tell()
                torch.save(piece, f)
                storage[MetadataIndex(key, torch.Size(offsets))] = _StorageInfo("__0_0.distcp", start, f.tell() - start)
                metas.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            sdm[key] = TensorStorageMetadata(TensorProperties(dtype=full[key].dtype), full[key].size(), metas)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage), f)
    target = {k: torch.zeros_like(v) for k, v in full.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=str(folder))  # torch's own reader agrees with the layout
    assert all(torch.equal(target[k], full[k]) for k in full)
    ckpt = load(folder)
    assert ckpt_view(ckpt) == torch_view(full)
    assert_same_values(ckpt, full)


def test_dcp_fixture(fixtures_dir):
    ckpt = load(fixtures_dir / "dcp")
    expected = torch.load(fixtures_dir / "tiny_mlp.pth", weights_only=True)
    assert ckpt.state_dict_key == "model"
    assert ckpt_view(ckpt) == torch_view(expected)
    assert_same_values(ckpt, expected)


# -------------------------------------------------------------------- devices


def _relocate_zip(src, dst, location):
    """Rewrite the saved device in data.pkl, as if the tensors had been saved from ``location``."""
    zin = zipfile.ZipFile(src)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X" + struct.pack("<I", len(location))
                                    + location.encode())
            zout.writestr(info.filename, data)


@pytest.mark.parametrize("fmt", ["torch-zip", "torch-legacy"])
def test_tensors_saved_on_cuda_are_listed_and_readable_on_cpu(tmp_path, run_cli, fmt):
    sd = {"w": torch.randn(3, 4), "b": torch.arange(5), "h": torch.randn(2).half()}
    src = tmp_path / "cpu.pth"
    dst = tmp_path / "cuda.pth"
    if fmt == "torch-zip":
        torch.save(sd, src)
        _relocate_zip(src, dst, "cuda:1")
    else:
        torch.save(sd, src, _use_new_zipfile_serialization=False)
        dst.write_bytes(src.read_bytes().replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:1"))
    real = torch.load(dst, map_location="cpu", weights_only=True)  # torch needs map_location here
    ckpt = load(dst)
    assert ckpt.format == fmt
    assert {t.device for t in ckpt.tensors} == {"cuda:1"}
    assert ckpt_view(ckpt) == torch_view(real)
    assert_same_values(ckpt, real)
    r = run_cli("inspect", str(dst), "--stats")
    assert r.code == 0 and "saved on cuda:1" in r.out
    r = run_cli("inspect", str(dst), "--unsafe", "--json")
    assert r.code == 0
    assert {t["device"] for t in json.loads(r.out)["tensors"]} == {"cuda:1"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_checkpoint(tmp_path, run_cli):
    sd = {"w": torch.randn(3, 4, device="cuda:0"), "b": torch.arange(5, device="cuda:0")}
    path = tmp_path / "gpu.pth"
    torch.save(sd, path)
    ckpt = load(path)
    assert {t.device for t in ckpt.tensors} == {"cuda:0"}
    assert_same_values(ckpt, {k: v.cpu() for k, v in sd.items()})
    path = tmp_path / "gpu_legacy.pth"
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    ckpt = load(path)
    assert {t.device for t in ckpt.tensors} == {"cuda:0"}
    assert_same_values(ckpt, {k: v.cpu() for k, v in sd.items()})


# ------------------------------------------------- containers and torch-free paths


def test_ema_and_training_containers_list_every_candidate(tmp_path, fixtures_dir):
    sd = torch.load(fixtures_dir / "tiny_mlp.pth", weights_only=True)
    model = nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(1, 2)).sum().backward()
    opt.step()
    path = tmp_path / "timm.pth"
    torch.save({"arch": "tiny", "state_dict": sd, "state_dict_ema": dict(sd), "optimizer": opt.state_dict(),
                "epoch": 3}, path)
    ckpt = load(path)
    assert ckpt.framework == "timm"
    assert ckpt.state_dict_key == "state_dict"
    assert [(c.key, c.chosen) for c in ckpt.candidates] == [("state_dict", True), ("state_dict_ema", False)]
    ema = load(path, key="state_dict_ema")
    assert ckpt_view(ema) == torch_view(sd)
    path = tmp_path / "swa.pth"
    torch.save({"model_ema": sd, "opt": opt.state_dict()}, path)
    only_ema = load(path)
    assert only_ema.state_dict_key == "model_ema"
    assert [c.key for c in only_ema.candidates] == ["model_ema"]  # optimizer moments are not candidates
    lightning = load(fixtures_dir / "lightning.ckpt")
    assert lightning.framework == "lightning"
    assert [(c.key, c.chosen) for c in lightning.candidates] == [("state_dict", True)]


@pytest.mark.parametrize("name", ["legacy.pth", "numpy_dict.pkl", "dill_model.dill", "dcp", "dcp/.metadata",
                                  "torch_tensors.pkl"])
def test_inspect_does_not_import_torch(tmp_path, fixtures_dir, name):
    if name == "torch_tensors.pkl":
        path = tmp_path / name
        with open(path, "wb") as f:
            pickle.dump({"w": torch.randn(2, 2)}, f)
    else:
        path = fixtures_dir / name
    code = ("import sys; from ckpt_tool.cli import main; rc = main(['inspect', sys.argv[1], '--json']); "
            "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'NOTORCH'); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(path)], check=False, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stderr.endswith("NOTORCH")
    assert json.loads(r.stdout)["tensors"]


def test_extension_mismatch_and_dill_extension(tmp_path, fixtures_dir):
    shutil.copy(fixtures_dir / "dill_model.dill", tmp_path / "model.pkl")
    assert not any(w.startswith("the extension") for w in load(tmp_path / "model.pkl").warnings)
    shutil.copy(fixtures_dir / "legacy.pth", tmp_path / "weights.safetensors")
    ckpt = load(tmp_path / "weights.safetensors")
    assert ckpt.format == "torch-legacy"
    assert any("extension .safetensors" in w for w in ckpt.warnings)



def test_meta_device_tensors_are_listed_without_data(tmp_path):
    # torch saves these through _rebuild_meta_tensor_no_storage: no storage, no bytes
    p = str(tmp_path / "meta.pth")
    torch.save({"m": torch.empty(2, 3, device="meta"), "w": torch.ones(4)}, p)
    with load(p) as ckpt:
        m, w = ckpt.by_key["m"], ckpt.by_key["w"]
        assert (m.device, m.shape, m.stride, m.dtype, m.storage) == ("meta", (2, 3), (3, 1), "float32", None)
        assert w.device == "cpu" and w.storage is not None
        assert any("meta device" in x for x in ckpt.warnings)
    assert torch.load(p, weights_only=True)["m"].shape == (2, 3)


class _RebuildFromAString:
    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, ("abc", 0, (1,), (1,), False, OrderedDict()))


def test_a_tensor_rebuilt_from_a_non_storage_is_refused_cleanly(tmp_path):
    p = str(tmp_path / "bad.pth")
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("bad/data.pkl", pickle.dumps({"w": _RebuildFromAString()}, protocol=2))
        z.writestr("bad/version", "3\n")
    r = run_subprocess("inspect", p)
    assert r.returncode == 2, r.stderr
    assert "not a storage" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_deflated_storages_read_as_torch_reads_them(tmp_path, run_cli):
    # torch.save stores members uncompressed, but torch.load inflates deflated ones (miniz): so does ckpt,
    # for inspect, --stats, gate's NaN check and migrate alike.
    import zipfile

    src = tmp_path / "stored.pth"
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, src)
    path = tmp_path / "deflated.pth"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            info.compress_type = zipfile.ZIP_DEFLATED if "/data/" in info.filename else zipfile.ZIP_STORED
            zout.writestr(info, data)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.load(src, weights_only=True)["w"])
    assert run_cli("gate", str(path)).code == 0
    r = run_cli("inspect", str(path), "--stats", "--json")
    assert r.code == 0 and json.loads(r.out)["tensors"][0]["stats"]["max"] == 5.0
    out = tmp_path / "out.safetensors"
    assert run_cli("migrate", str(path), "-o", str(out)).code == 0
    from safetensors.torch import load_file

    assert torch.equal(load_file(out)["w"], torch.load(src, weights_only=True)["w"])


def test_python2_spellings_of_safe_builtins_are_safe(run_cli, tmp_path):
    # protocol 2 pickles a range as __builtin__.xrange, which Python 3 maps to builtins.range
    path = tmp_path / "r.pth"
    torch.save({"w": torch.ones(1), "steps": range(3)}, path, pickle_protocol=2)
    r = run_cli("scan", str(path), "--json")
    assert r.code == 0, r.out


@pytest.mark.parametrize("positions", [(0, 2), (1, 5), (0, 3, 6), (2, 4, 7), (5, 6), (0, 1, 2, 3)])
def test_duplicate_members_read_as_torchs_reader_finds_them(tmp_path, run_cli, positions):
    # miniz sorts the central directory with an unstable heap sort and binary-searches it: which of several
    # same-named data.pkl entries torch reads depends on where they sit. ckpt replays it (io/zip/miniz.py).
    import zipfile

    def members_of(path):
        with zipfile.ZipFile(path) as z:
            return [(i.filename, z.read(i.filename)) for i in z.infolist()]

    torch.save({"w": torch.ones(2), "m": torch.zeros(1)}, tmp_path / "base.pth")
    base = members_of(tmp_path / "base.pth")
    pkl_name = next(n for n, _ in base if n.endswith("/data.pkl"))
    layout = [(n, d) for n, d in base if n != pkl_name]
    for i, pos in enumerate(positions):  # variant i names its second tensor "marker{i}"
        torch.save({"w": torch.ones(2), f"marker{i}": torch.zeros(1)}, tmp_path / "v.pth")
        pkl = dict(members_of(tmp_path / "v.pth"))[pkl_name.replace("base/", "v/")]
        layout.insert(min(pos, len(layout)), (pkl_name, pkl))
    path = tmp_path / "dups.pth"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in layout:
            z.writestr(zipfile.ZipInfo(n), d)
    expected = sorted(torch.load(path, weights_only=True))
    r = run_cli("inspect", str(path), "--json")
    assert r.code == 0, r
    assert sorted(t["key"] for t in json.loads(r.out)["tensors"]) == expected
