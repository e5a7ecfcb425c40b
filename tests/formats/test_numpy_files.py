"""NumPy weight files (.npy, .npz) as np.save/np.savez and MLX write them, and GGUF named and refused.

Every file here is written by the real library (NumPy; MLX and gguf-py where installed) and every
value read back is compared with what ``np.load`` (or ``mx.load``) returns.
"""
from __future__ import annotations

import ast
import io
import json
import os
import struct
import zipfile

import numpy as np
import pytest

from ckpt_tool.errors import InputError
from ckpt_tool.formats.numpy.header import parse_header

# -- the header parser against NumPy's own ---------------------------------------------------------


def _npy_bytes(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=version, allow_pickle=True)
    return buf.getvalue()


def _raw_header(text: str, version: int = 1) -> bytes:
    body = text.encode("latin1" if version < 3 else "utf8")
    fmt = "<H" if version == 1 else "<I"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(fmt, len(body)) + body


def _numpy_header(stream: io.BytesIO, version: tuple[int, int]):
    """np.load's own header reader (the private one reads every version; the public ones 1.0 and 2.0)."""
    impl = getattr(np.lib, "_format_impl", None)
    if impl is not None:
        return impl._read_array_header(stream, version)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(stream)


ARRAYS = {
    "f4": np.arange(6, dtype="<f4").reshape(2, 3),
    "f2": np.ones(3, dtype=np.float16),
    "f8-fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    "i1": np.array([-1, 2], dtype=np.int8),
    "u1": np.array([1, 2], dtype=np.uint8),
    "u2": np.array([1, 2], dtype=np.uint16),
    "u8": np.array([1, 2], dtype=np.uint64),
    "i8-3d": np.zeros((2, 1, 3), dtype=np.int64),
    "bool": np.array([True, False]),
    "c8": np.array([1 + 2j], dtype=np.complex64),
    "c16": np.array([1 + 2j], dtype=np.complex128),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_header_matches_numpy(name, version):
    arr = ARRAYS[name]
    data = _npy_bytes(arr, version)
    h = parse_header(data, "x.npy")
    stream = io.BytesIO(data)
    major, minor = np.lib.format.read_magic(stream)
    shape, fortran, dtype = _numpy_header(stream, (major, minor))
    assert h.shape == shape and h.fortran_order == fortran
    assert h.data_start == stream.tell()
    assert h.dtype is not None and h.dtype.itemsize == dtype.itemsize


@pytest.mark.parametrize("text", [
    "{'descr': '<f4', 'fortran_order': False}",  # a key missing
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",  # a key too many
    "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",  # not a bool
    "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",  # not a tuple
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",  # not a literal
    "__import__('os').system('true')",  # code: never evaluated
    "['descr', 'fortran_order', 'shape']",
])
def test_bad_headers_refused_as_numpy_refuses_them(text):
    data = _raw_header(text)
    with pytest.raises(Exception):  # noqa: B017 - NumPy raises ValueError or tokenize.TokenError
        stream = io.BytesIO(data)
        _numpy_header(stream, np.lib.format.read_magic(stream))
    with pytest.raises(InputError):
        parse_header(data, "x.npy")


def test_object_dtypes_found_in_every_spelling():
    for descr in ["'|O'", "'O'", "[('a', '<f4'), ('b', '|O')]", "('|O', (2,))", "[('O', '<f4'), ('x', [('y', '|O')])]"]:
        h = parse_header(_raw_header(f"{{'descr': {descr}, 'fortran_order': False, 'shape': (1,)}}"), "x.npy")
        assert h.is_object, descr
        assert np.lib.format.descr_to_dtype(ast.literal_eval(descr)).hasobject, descr
    plain = parse_header(_raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}"), "x.npy")
    assert not plain.is_object


@pytest.mark.parametrize("arr,what", [
    (np.array([1.0], dtype=">f4"), "big-endian"),
    (np.array(["ab"]), "not a tensor dtype"),
    (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "structured"),
])
def test_arrays_that_are_not_weights_refused_naming_why(arr, what):
    with pytest.raises(InputError, match=what):
        parse_header(_npy_bytes(arr), "x.npy")


# -- real files through the commands --------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("npfiles")
    np.save(d / "array.npy", ARRAYS["f4"])
    np.save(d / "fortran.npy", ARRAYS["f8-fortran"])
    np.save(d / "dict.npy", {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float16)}, allow_pickle=True)
    flax = {"params/dense/kernel": np.arange(8, dtype=np.float32).reshape(4, 2),
            "params/dense/bias": np.zeros(2, np.float32), "params/embed": np.asfortranarray(np.ones((3, 2)))}
    np.savez(d / "flax.npz", **flax)
    np.savez_compressed(d / "compressed.npz", **{k: ARRAYS[k] for k in ("i8-3d", "bool", "u2", "c8", "scalar")})
    (d / "empty.npz").write_bytes(_empty_zip())
    return d


def _empty_zip() -> bytes:
    buf = io.BytesIO()
    zipfile.ZipFile(buf, "w").close()
    return buf.getvalue()


def _load_out(path):
    import torch
    from safetensors.torch import load_file

    return load_file(str(path)) if str(path).endswith(".safetensors") else torch.load(path, weights_only=True)


def _np_of(t):
    import torch

    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("name,fmt", [("array.npy", "numpy"), ("fortran.npy", "numpy"), ("dict.npy", "numpy"),
                                      ("flax.npz", "npz"), ("compressed.npz", "npz")])
def test_inspect_lists_what_np_load_returns(run_cli, files, name, fmt):
    r = run_cli("inspect", str(files / name), "--json")
    assert r.code == 0, r
    report = json.loads(r.out)
    assert report["format"] == fmt
    rows = {t["key"]: t for t in report["tensors"]}
    expected = _np_load(files / name)
    assert set(rows) == set(expected)
    for key, arr in expected.items():
        assert rows[key]["shape"] == list(arr.shape), key
        assert rows[key]["nbytes"] == arr.nbytes, key


@pytest.mark.parametrize("out", ["x.safetensors", "x.pth"])
@pytest.mark.parametrize("name", ["array.npy", "fortran.npy", "dict.npy", "flax.npz", "compressed.npz"])
def test_migrate_writes_the_values_np_load_reads(run_cli, files, tmp_path, name, out):
    target = tmp_path / out
    r = run_cli("migrate", str(files / name), "-o", str(target))
    assert r.code == 0, r
    got = _load_out(target)
    expected = _np_load(files / name)
    assert set(got) == set(expected)
    for key, arr in expected.items():
        assert got[key].numpy().tobytes() == np.ascontiguousarray(arr).tobytes(), key
        assert tuple(got[key].shape) == arr.shape


def test_diff_npz_against_its_safetensors_copy(run_cli, files, tmp_path):
    target = tmp_path / "flax.safetensors"
    assert run_cli("migrate", str(files / "flax.npz"), "-o", str(target)).code == 0
    r = run_cli("diff", str(files / "flax.npz"), str(target), "--values")
    assert r.code == 0, r
    assert "no differences" in r.out
    changed = dict(np.load(files / "flax.npz"))
    changed["params/dense/bias"] = changed["params/dense/bias"] + 1
    np.savez(tmp_path / "changed.npz", **changed)
    r = run_cli("diff", str(tmp_path / "changed.npz"), str(target), "--values", "--json")
    assert r.code == 1, r
    assert "params/dense/bias" in r.out


@pytest.mark.parametrize("name", ["array.npy", "dict.npy", "flax.npz", "compressed.npz"])
def test_benign_numpy_files_scan_safe_and_pass_the_gate(run_cli, files, name):
    r = run_cli("scan", str(files / name))
    assert r.code == 0 and "SAFE" in r.out, r
    r = run_cli("gate", str(files / name))
    assert r.code == 0, r


def test_npz_is_never_called_a_damaged_torch_zip(run_cli, files, tmp_path):
    data = (files / "flax.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) - 30])
    r = run_cli("inspect", str(tmp_path / "cut.npz"))
    assert r.code == 2, r
    assert "torch" not in r.err.lower() and len(r.err.strip().splitlines()) == 1, r


def test_empty_npz_refused(run_cli, files):
    r = run_cli("inspect", str(files / "empty.npz"))
    assert r.code == 2 and "no arrays" in r.err, r


def test_npz_member_that_is_not_an_array_is_named(run_cli, files, tmp_path):
    path = tmp_path / "extra.npz"
    np.savez(path, w=np.ones(2, np.float32))
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("README.txt", "notes")
    r = run_cli("inspect", str(path))
    assert r.code == 0 and "README.txt" in r.out, r


@pytest.mark.parametrize("arr", [np.array([1.0], dtype=">f4"), np.array(["ab"])])
def test_unreadable_arrays_are_one_line_exit_2(run_cli, tmp_path, arr):
    np.save(tmp_path / "x.npy", arr)
    r = run_cli("inspect", str(tmp_path / "x.npy"))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r


# -- object arrays: pickles np.load(allow_pickle=True) runs ---------------------------------------

class _Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def hostile(tmp_path):
    marker = tmp_path / "PWNED"
    arr = np.empty((), dtype=object)
    arr[()] = {"w": np.ones(2, np.float32), "x": _Payload(str(marker))}
    np.save(tmp_path / "evil.npy", arr, allow_pickle=True)
    np.savez(tmp_path / "evil.npz", w=np.ones(3, np.float32), meta=arr)
    np.savez_compressed(tmp_path / "evil_compressed.npz", meta=arr)
    return tmp_path, marker


@pytest.mark.parametrize("name", ["evil.npy", "evil.npz", "evil_compressed.npz"])
def test_object_array_payload_named_by_scan_gate_and_inspect(run_cli, hostile, name):
    folder, marker = hostile
    path = str(folder / name)
    r = run_cli("scan", path)
    assert r.code == 1 and "posix.system" in r.out, r
    r = run_cli("gate", path)
    assert r.code == 1, r
    r = run_cli("inspect", path)
    assert "posix.system" in r.out + r.err, r
    assert not marker.exists()


def test_object_array_payload_runs_under_np_load(hostile):
    """The reference: np.load(allow_pickle=True) runs it (so scan's 'dangerous' is no false alarm)."""
    import subprocess
    import sys

    folder, marker = hostile
    code = f"import numpy as np; np.load({str(folder / 'evil.npy')!r}, allow_pickle=True)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert marker.exists()


# -- MLX and GGUF ---------------------------------------------------------------------------------

def test_mlx_npz_and_npy_read_with_bfloat16(run_cli, tmp_path):
    mx = pytest.importorskip("mlx.core", reason="MLX not installed (test-only: pip install 'mlx[cpu]')")
    arrays = {"layers.0.weight": mx.array([[1.5, 2.0, -3.0], [0.25, 4.0, 8.0]], dtype=mx.bfloat16),
              "layers.0.bias": mx.array([1.0, 2.0]), "embed": mx.array([[1, 2], [3, 4]], dtype=mx.int32).T}
    mx.savez(str(tmp_path / "mlx.npz"), **arrays)
    mx.save(str(tmp_path / "one.npy"), arrays["embed"])
    r = run_cli("inspect", str(tmp_path / "mlx.npz"), "--json")
    assert r.code == 0, r
    rows = {t["key"]: t for t in json.loads(r.out)["tensors"]}
    assert rows["layers.0.weight"]["dtype"] == "bfloat16"
    assert r.out.count("MLX") >= 1
    out = tmp_path / "mlx.safetensors"
    assert run_cli("migrate", str(tmp_path / "mlx.npz"), "-o", str(out)).code == 0
    got = _load_out(out)
    for key, arr in arrays.items():
        want = np.array(arr.astype(mx.float32)) if arr.dtype == mx.bfloat16 else np.array(arr)
        assert np.array_equal(got[key].float().numpy(), want.astype(np.float32)), key
    assert run_cli("migrate", str(tmp_path / "one.npy"), "-o", str(tmp_path / "one.pth")).code == 0
    assert np.array_equal(_load_out(tmp_path / "one.pth")["arr_0"].numpy(), np.array(arrays["embed"]))


@pytest.fixture
def gguf_file(tmp_path):
    gguf = pytest.importorskip("gguf", reason="gguf-py not installed (test-only: pip install gguf)")
    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("command", [["inspect"], ["diff", "SELF"], ["migrate", "-o", "OUT"], ["gate"]])
def test_gguf_named_and_refused(run_cli, gguf_file, tmp_path, command):
    args = [a.replace("SELF", str(gguf_file)).replace("OUT", str(tmp_path / "o.safetensors")) for a in command]
    r = run_cli(args[0], str(gguf_file), *args[1:])
    assert r.code in (1, 2), r
    assert "GGUF" in r.out + r.err, r
    assert "Traceback" not in r.err
    assert not (tmp_path / "o.safetensors").exists()


def test_gguf_scan_is_an_error_never_safe(run_cli, gguf_file):
    r = run_cli("scan", str(gguf_file), "--json")
    assert r.code == 2, r
    report = json.loads(r.out)
    verdicts = [f["verdict"] for f in report["files"]]
    assert verdicts == ["error"], report
    assert "GGUF" in r.out


def test_weights_only_prediction_is_what_torch_load_does(run_cli, files):
    """torch.load refuses NumPy files (no torch zip, no pickle at byte 0): inspect predicts that, measured."""
    import subprocess
    import sys

    names = ["array.npy", "dict.npy", "flax.npz", "compressed.npz"]
    code = ("import sys, torch\nfor p in sys.argv[1:]:\n    try:\n        torch.load(p, weights_only=True)\n"
            "        print('loads')\n    except Exception:\n        print('refused')\n")
    proc = subprocess.run([sys.executable, "-c", code, *(str(files / n) for n in names)], capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.split() == ["refused"] * len(names), proc.stdout
    for name in names:
        pred = json.loads(run_cli("inspect", str(files / name), "--json").out)["weights_only"]
        assert pred["loads"] is False and "np.load" in pred["reason"], (name, pred)


def _np_load(path) -> dict:
    """What np.load gives, as ckpt names it: an archive's members, a pickled dict, or one array as arr_0."""
    loaded = np.load(path, allow_pickle=True)
    if isinstance(loaded, np.lib.npyio.NpzFile):
        return {k: loaded[k] for k in loaded.files}
    if loaded.dtype == object:
        return loaded.item()
    return {"arr_0": loaded}
