"""Every dtype torch 2.13 saves, through every command: inspect, scan, gate, diff and migrate.

The checkpoints are real torch.save files of tests/helpers/dtype_samples.py's tensors (one per dtype, quantized
per tensor and per channel included); the expectations come from torch itself, loaded in a subprocess.
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT, cli

from tests.helpers.bits import bits
from tests.helpers.dtype_samples import QUANTIZED, all_samples, per_channel_qint8, plain_names
from tests.helpers.errors import assert_one_line_error

ALL = [*plain_names(), *QUANTIZED, "qint8_per_channel"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(A, B): every dtype in one file each; B's element [0, 1] differs from A's in every tensor."""
    folder = tmp_path_factory.mktemp("dtypes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"; quantize_per_tensor is deprecated
        a, b = all_samples(), all_samples(changed=True)
    torch.save(a, folder / "a.pth")
    torch.save(b, folder / "b.pth")
    return folder / "a.pth", folder / "b.pth"


@pytest.fixture(scope="module")
def inspected(files):
    r = cli("inspect", "--json", str(files[0]))
    assert r.code == 0, r.err
    return {t["key"]: t for t in json.loads(r.out)["tensors"]}


@pytest.mark.parametrize("key", ALL)
def test_inspect_lists_every_dtype(inspected, key):
    dtype = "qint8" if key == "qint8_per_channel" else key
    t = inspected[key]
    assert t["dtype"] == dtype
    assert t["shape"] == ([2, 3] if key == "qint8_per_channel" else [2, 2])


def test_scan_calls_every_dtype_safe(files):
    r = cli("scan", "--json", str(files[0]))
    assert r.code == 0, r.err
    assert [f["verdict"] for f in json.loads(r.out)["files"]] == ["safe"]


def test_gate_passes_every_dtype_and_strict_names_the_unusual_ones(files):
    r = cli("gate", "--json", str(files[0]))
    assert r.code == 0, r.out
    checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
    assert checks["weights-only"]["passed"] and checks["loads-safely"]["passed"]
    strict = cli("gate", "--strict", str(files[0]))
    assert strict.code == 1
    assert "unusual dtypes" in strict.out and "float4_e2m1fn_x2" in strict.out


def test_torch_loads_what_ckpt_reads_bit_for_bit(files):
    """Differential: torch.load(weights_only=True) in a fresh process gives the bytes ckpt reads, per key."""
    from ckpt_tool import load
    from ckpt_tool.tensors.data import tensor_bytes

    code = ("import sys, json, torch, warnings\nwarnings.simplefilter('ignore')\n"
            "sd = torch.load(sys.argv[1], weights_only=True)\n"
            "out = {}\n"
            "for k, t in sd.items():\n"
            "    raw = t.int_repr() if t.is_quantized else t\n"
            "    out[k] = [str(t.dtype).removeprefix('torch.'), list(t.shape),"
            " raw.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()]\n"
            "print(json.dumps(out))\n")
    p = subprocess.run([sys.executable, "-c", code, str(files[0])], capture_output=True, text=True, timeout=120,
                       check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    expected = json.loads(p.stdout)
    ckpt = load(str(files[0]))
    got = {t.key: [t.dtype, list(t.shape), tensor_bytes(t).hex()] for t in ckpt.tensors}
    assert sorted(got) == sorted(expected) == sorted(ALL)
    assert got == expected


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (A, B): one file per dtype, B's element [0, 1] changed."""
    folder = tmp_path_factory.mktemp("dtype-pairs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = all_samples(), all_samples(changed=True)
    out = {}
    for key in ALL:
        torch.save({key: a[key]}, folder / f"a_{key}.pth")
        torch.save({key: b[key]}, folder / f"b_{key}.pth")
        out[key] = (folder / f"a_{key}.pth", folder / f"b_{key}.pth")
    return out


@pytest.mark.parametrize("key", ALL)
def test_diff_values_of_a_file_with_itself_is_equal(pairs, key):
    r = cli("diff", "--values", "--json", str(pairs[key][0]), str(pairs[key][0]))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["equal"] and [v["passed"] for v in doc["values"]] == [True]


@pytest.mark.parametrize("key", ALL)
def test_diff_values_finds_the_one_changed_element(pairs, key):
    r = cli("diff", "--values", "--json", str(pairs[key][0]), str(pairs[key][1]))
    assert r.code == 1, r.err
    doc = json.loads(r.out)
    assert not doc["equal"]
    (value,) = doc["values"]
    assert value["key"] == key and not value["passed"]
    assert value["mismatched"] == 1, value


# The NaN encodings of the 8-bit floats: e4m3fn S.1111.111, e5m2 S.11111.xx (xx != 0), fnuz 0x80 (the "-0"),
# e8m0fnu 0xff; float16-based complex32 takes float16's.
NANS = {"float8_e4m3fn": [0x7F, 0xFF], "float8_e5m2": [0x7D, 0xFE], "float8_e4m3fnuz": [0x80],
        "float8_e5m2fnuz": [0x80], "float8_e8m0fnu": [0xFF]}


def _bytes_tensor(dtype: str, codes: list[int]) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.uint8).view(getattr(torch, dtype))


@pytest.mark.parametrize(("dtype", "nan"), [(d, n) for d, codes in NANS.items() for n in codes])
def test_nan_encodings_are_nan_to_diff_and_gate(tmp_path, dtype, nan):
    a = tmp_path / "a.pth"
    b = tmp_path / "b.pth"
    torch.save({"w": _bytes_tensor(dtype, [0x38, nan, 0x30])}, a)
    torch.save({"w": _bytes_tensor(dtype, [0x38, 0x30, 0x30])}, b)
    same = cli("diff", "--values", "--json", str(a), str(a))
    assert same.code == 0, same.err
    (v,) = json.loads(same.out)["values"]
    assert (v["nan_a"], v["nan_b"], v["passed"]) == (1, 1, True)
    other = cli("diff", "--values", "--json", str(a), str(b))
    assert other.code == 1, other.err
    (v,) = json.loads(other.out)["values"]
    assert (v["nan_a"], v["nan_b"], v["mismatched"], v["max_abs"]) == (1, 0, 1, "inf")
    gate = cli("gate", "--json", str(a))
    assert gate.code == 1
    checks = {c["name"]: c for c in json.loads(gate.out)["files"][0]["checks"]}
    assert not checks["no-nan-inf"]["passed"] and "1 NaN" in checks["no-nan-inf"]["detail"]


def test_float4_holds_no_nan_and_passes_the_nan_check(tmp_path):
    path = tmp_path / "f4.pth"
    torch.save({"w": _bytes_tensor("float4_e2m1fn_x2", list(range(256)))}, path)  # every code pair
    r = cli("gate", "--json", str(path))
    assert r.code == 0, r.out
    stats = cli("inspect", "--stats", "--json", str(path))
    assert stats.code == 0, stats.err
    (t,) = json.loads(stats.out)["tensors"]
    assert t["stats"] == {"min": -6.0, "max": 6.0, "mean": 0.0, "std": t["stats"]["std"], "nan": 0, "inf": 0}


def test_inspect_stats_of_quantized_are_of_the_dequantized_values(files):
    r = cli("inspect", "--stats", "--json", str(files[0]))
    assert r.code == 0, r.err
    stats = {t["key"]: t.get("stats") for t in json.loads(r.out)["tensors"]}
    assert stats["qint8"]["min"] == -0.125 and stats["qint8"]["max"] == 0.125
    deq = per_channel_qint8().dequantize()
    assert (stats["qint8_per_channel"]["min"], stats["qint8_per_channel"]["max"]) == (deq.min(), deq.max())
    assert stats["bits8"]["min"] is None  # bit patterns: no figures


def test_diff_of_float4_compares_the_decoded_fp4_values(tmp_path):
    """0x21 holds 0.5 (low nibble) and 1.0; 0x31 holds 0.5 and 1.5: one fp4 value differs, by 0.5."""
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": _bytes_tensor("float4_e2m1fn_x2", [0x21, 0x00])}, a)
    torch.save({"w": _bytes_tensor("float4_e2m1fn_x2", [0x31, 0x00])}, b)
    r = cli("diff", "--values", "--json", str(a), str(b))
    assert r.code == 1, r.err
    (v,) = json.loads(r.out)["values"]
    assert (v["numel"], v["mismatched"], v["max_abs"], v["compared_as"]) == (4, 1, 0.5, "float32")


def test_diff_quantized_with_the_same_integers_under_another_scale_differs(tmp_path):
    """Regression (qint8 diff crashed): the quantizer is part of the value; dequantized values are compared."""
    x = torch.tensor([0.5, -0.25, 1.0])
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"q": torch.quantize_per_tensor(x, 0.25, 0, torch.qint8)}, a)
    torch.save({"q": torch.quantize_per_tensor(x * 2, 0.5, 0, torch.qint8)}, b)  # same integers, scale doubled
    assert torch.load(a)["q"].int_repr().tolist() == torch.load(b)["q"].int_repr().tolist()
    r = cli("diff", "--values", "--json", str(a), str(b))
    assert r.code == 1, r.err
    (v,) = json.loads(r.out)["values"]
    assert (v["mismatched"], v["max_abs"], v["compared_as"]) == (3, 1.0, "float32")


def test_diff_bits_against_uint8_compares_bit_patterns(tmp_path):
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": _bytes_tensor("bits8", [1, 2, 3])}, a)
    torch.save({"w": torch.tensor([1, 2, 4], dtype=torch.uint8)}, b)
    r = cli("diff", "--values", "--json", str(a), str(b))
    assert r.code == 1, r.err
    doc = json.loads(r.out)
    assert doc["dtype_mismatch"] == [{"key": "w", "a": "bits8", "b": "uint8"}]
    (v,) = doc["values"]
    assert (v["mismatched"], v["max_abs"]) == (1, 1.0)


def _torch_dumps(paths) -> list[dict]:
    """Per path, key -> [dtype, shape, raw bytes hex, quantizer] as torch.load(weights_only=True) (safetensors'
    load_file for a .safetensors) reads it: all in one fresh process (torch's import costs a second)."""
    code = ("import sys, json, torch, warnings\nwarnings.simplefilter('ignore')\n"
            "from safetensors.torch import load_file\n"
            "def dump(p):\n"
            "    sd = load_file(p) if p.endswith('.safetensors') else torch.load(p, weights_only=True)\n"
            "    out = {}\n"
            "    for k, t in sd.items():\n"
            "        q = None\n"
            "        if t.is_quantized:\n"
            "            q = [str(t.qscheme()), t.q_scale() if t.qscheme() == torch.per_tensor_affine else "
            "t.q_per_channel_scales().tolist()]\n"
            "            t = t.int_repr()\n"
            "        out[k] = [str(t.dtype).removeprefix('torch.'), list(t.shape),"
            " t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex(), q]\n"
            "    return out\n"
            "print(json.dumps([dump(p) for p in sys.argv[1:]]))\n")
    p = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, timeout=120,
                       check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_migrate_to_pth_keeps_every_dtype_exactly(files, tmp_path):
    out = tmp_path / "out.pth"
    r = cli("migrate", "--json", str(files[0]), "-o", str(out))
    assert r.code == 0, r.err
    assert all(json.loads(r.out)["verified"].values())
    got, expected = _torch_dumps([out, files[0]])
    assert got == expected


def test_migrate_to_safetensors_writes_what_it_can_hold_and_names_what_it_cannot(pairs, tmp_path):
    """Per dtype: written where safetensors has a code (loaded back by safetensors bit for bit), else refused
    naming the key and dtype, nothing written."""
    from ckpt_tool import dtypes

    written = []
    for key in plain_names():
        out = tmp_path / f"{key}.safetensors"
        r = cli("migrate", str(pairs[key][0]), "-o", str(out))
        if dtypes.lookup(key).safetensors is None:
            assert_one_line_error(r, repr(key), key, "safetensors")
            assert not out.exists()
        else:
            assert r.code == 0, (key, r.err)
            written.append(key)
    assert "float4_e2m1fn_x2" in written and "float8_e8m0fnu" in written and "bits8" not in written
    dumps = _torch_dumps([tmp_path / f"{k}.safetensors" for k in written] + [pairs[k][0] for k in written])
    assert dumps[:len(written)] == dumps[len(written):]


def test_dtype_cast_is_refused_where_ckpt_cannot_prove_it(pairs, tmp_path):
    """--dtype fp32 casts the float dtypes whose casts castloss.py proves; other float dtypes are refused
    (naming the key and dtype, nothing written); integer, bits and complex tensors are kept as they are."""
    from ckpt_tool import dtypes, load

    for key in plain_names():
        out = tmp_path / f"{key}.pth"
        r = cli("migrate", "--dtype", "fp32", str(pairs[key][0]), "-o", str(out))
        dt = dtypes.lookup(key)
        if dt.is_floating and key not in dtypes.CAST_CHECKED:
            assert_one_line_error(r, repr(key), key)
            assert not out.exists()
            continue
        assert r.code == 0, (key, r.err)
        (t,) = load(str(out)).tensors
        assert t.dtype == ("float32" if dt.is_floating else key)


def test_safetensors_f4_and_e8m0_written_by_safetensors_are_read_with_torchs_shapes(tmp_path):
    from safetensors.torch import save_file

    f4 = torch.arange(6, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 3)
    e8 = torch.tensor([1.0, 2.0, 0.5]).to(torch.float8_e8m0fnu)
    path = tmp_path / "mx.safetensors"
    save_file({"w": f4, "s": e8}, str(path))
    r = cli("inspect", "--json", str(path))
    assert r.code == 0, r.err
    got = {t["key"]: (t["dtype"], t["shape"], t["nbytes"]) for t in json.loads(r.out)["tensors"]}
    assert got == {"w": ("float4_e2m1fn_x2", [2, 3], 6), "s": ("float8_e8m0fnu", [3], 3)}
    out = tmp_path / "back.pth"
    assert cli("migrate", str(path), "-o", str(out)).code == 0
    loaded = torch.load(out, weights_only=True)
    assert torch.equal(bits(loaded["w"]), bits(f4)) and loaded["w"].shape == (2, 3)


def test_safetensors_f4_with_an_odd_number_of_values_is_refused(tmp_path):
    """safetensors' F4 counts fp4 values: a last dimension of 3 is not whole bytes, torch cannot hold it."""
    header = json.dumps({"w": {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00" * 3)
    assert_one_line_error(cli("inspect", str(path)), "'w'", "F4[2, 3]", "float4_e2m1fn_x2")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with pytest.raises(SafetensorError, match="divisible by 2"):  # safetensors refuses it too
        load_file(str(path))


def test_migrate_to_dcp_holds_every_dtype_but_the_bits_types(tmp_path):
    """DCP output (torch's own writer): bits types refused naming key and dtype; every other plain dtype
    written, read back equal by ckpt (diff --values) and by torch's dcp.load."""
    from ckpt_tool import dtypes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = {k: v for k, v in all_samples().items() if not v.is_quantized}
    src = tmp_path / "plain.pth"
    torch.save(samples, src)
    r = cli("migrate", str(src), "--to", "dcp", "-o", str(tmp_path / "refused"))
    assert_one_line_error(r, "dcp", "bits")
    assert not (tmp_path / "refused").exists()
    kept = {k: v for k, v in samples.items() if dtypes.lookup(k).kind != "bits"}
    src = tmp_path / "nobits.pth"
    torch.save(kept, src)
    out = tmp_path / "dcp"
    r = cli("migrate", str(src), "--to", "dcp", "-o", str(out))
    assert r.code == 0, r.err
    same = cli("diff", "--values", "--json", str(src), str(out))
    assert same.code == 0, same.out + same.err
    code = ("import sys, torch, warnings\nwarnings.simplefilter('ignore')\n"
            "import torch.distributed.checkpoint as dcp\n"
            "want = torch.load(sys.argv[1], weights_only=True)\n"
            "got = {k: torch.zeros(v.numel() * v.element_size(), dtype=torch.uint8).view(v.dtype).reshape(v.shape)"
            " for k, v in want.items()}\n"
            "dcp.load(got, checkpoint_id=sys.argv[2], no_dist=True)\n"
            "bad = [k for k in want if not torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))]\n"
            "assert not bad, bad\nprint(len(got))\n")
    p = subprocess.run([sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True,
                       timeout=120, check=False, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout) == len(kept)


def test_mx_weights_migrate_to_sharded_safetensors_and_an_hf_folder(tmp_path):
    """float4 weights with float8_e8m0fnu scales (an MXFP4 layout): a sharded set and a Hugging Face folder
    that safetensors' own load_file reads back bit for bit, with torch's shapes."""
    sd = {f"l{i}.w": torch.arange(i, i + 2048, dtype=torch.int64).to(torch.uint8).view(torch.float4_e2m1fn_x2)
          .reshape(2, 1024) for i in range(3)}
    sd.update({f"l{i}.s": torch.tensor([1.0, 2.0, 0.25]).to(torch.float8_e8m0fnu) for i in range(3)})
    src = tmp_path / "mx.pth"
    torch.save(sd, src)
    sharded, hf = tmp_path / "sharded", tmp_path / "hf"
    r = cli("migrate", str(src), "-o", str(sharded), "--to", "safetensors", "--max-shard-size", "3KB")
    assert r.code == 0, r.err
    assert len(list(sharded.glob("*.safetensors"))) == 3
    r = cli("migrate", str(src), "--to", "hf", "-o", str(hf))
    assert r.code == 0, r.err
    dumps = _torch_dumps([*sorted(sharded.glob("*.safetensors")), hf / "model.safetensors", src])
    merged = {k: v for d in dumps[:3] for k, v in d.items()}
    assert merged == dumps[3] == dumps[4]


@pytest.mark.parametrize("key", ["bits8", "bits16", "float4_e2m1fn_x2", "float8_e8m0fnu", "complex32", "uint64"])
def test_legacy_format_files_of_the_new_dtypes_are_read_as_torch_reads_them(tmp_path, key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = all_samples()[key]
    path = tmp_path / "legacy.pth"
    torch.save({key: t}, path, _use_new_zipfile_serialization=False)
    r = cli("inspect", "--json", str(path))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "torch-legacy"
    assert [(x["dtype"], x["shape"]) for x in doc["tensors"]] == [(key, [2, 2])]
    from ckpt_tool import load
    from ckpt_tool.tensors.data import tensor_bytes

    (meta,) = load(str(path)).tensors
    assert tensor_bytes(meta) == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


SUB_BYTE = [f"{p}int{n}" for p in ("", "u") for n in range(1, 8)]


def _crafted(path, name: str, values: list[int]) -> None:
    """A torch.save file of a uint16 tensor whose pickle names ``torch.<name>`` instead: torch.save refuses the
    sub-byte integers, but torch.load reads such a pickle (one byte per element)."""
    import io
    import zipfile

    buf = io.BytesIO()
    torch.save({"x": torch.tensor(values, dtype=torch.int32).to(torch.uint16)}, buf)
    with zipfile.ZipFile(buf) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                assert data.count(b"torch\nuint16\n") == 1
                data = data.replace(b"torch\nuint16\n", f"torch\n{name}\n".encode())
            zout.writestr(info.filename, data)


@pytest.fixture(scope="module")
def sub_byte(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sub-byte")
    out = {}
    for name in SUB_BYTE:
        a, b = folder / f"a_{name}.pth", folder / f"b_{name}.pth"
        _crafted(a, name, [1, 0, 1, 1])
        _crafted(b, name, [1, 1, 1, 1])
        out[name] = (a, b)
    return out


def test_sub_byte_integers_torch_loads_are_read_alike(sub_byte, tmp_path):
    """int1..int7/uint1..uint7: torch.load(weights_only=True) reads the crafted files (one process for all);
    ckpt reads the same dtype, shape and bytes, scan/gate pass, diff compares them, migrate keeps them in a
    .pth and refuses them in safetensors."""
    from ckpt_tool import load
    from ckpt_tool.tensors.data import tensor_bytes

    outs = {name: tmp_path / f"{name}.pth" for name in SUB_BYTE}
    for name, (a, b) in sub_byte.items():
        assert cli("scan", str(a)).code == 0
        assert cli("gate", str(a)).code == 0
        assert cli("diff", "--values", str(a), str(a)).code == 0
        r = cli("diff", "--values", "--json", str(a), str(b))
        assert r.code == 1, (name, r.err)
        assert [v["mismatched"] for v in json.loads(r.out)["values"]] == [1]
        assert cli("migrate", str(a), "-o", str(outs[name])).code == 0
        assert_one_line_error(cli("migrate", str(a), "-o", str(tmp_path / f"{name}.safetensors")), "'x'", name)
    dumps = _torch_dumps([sub_byte[n][0] for n in SUB_BYTE] + [outs[n] for n in SUB_BYTE])
    for i, name in enumerate(SUB_BYTE):
        (meta,) = load(str(sub_byte[name][0])).tensors
        assert dumps[i] == dumps[i + len(SUB_BYTE)] == {"x": [name, [4], tensor_bytes(meta).hex(), None]}
        assert tensor_bytes(meta) == bytes([1, 0, 0, 0])  # 4 one-byte elements: the first 4 bytes of the storage


def test_float4_and_bits_larger_than_a_chunk_and_strided_views_are_compared_exactly(tmp_path):
    """Tensors past one comparison chunk (closeness.CHUNK elements) are converted chunk by chunk; transposed
    (non-contiguous) bits and float4 views are gathered; one changed byte is one mismatch (two fp4 values
    share a byte: changing both nibbles is two)."""
    from ckpt_tool.tensors.numerics import CHUNK

    n = CHUNK + 1000
    raw = (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8)
    changed = raw.clone()
    changed[CHUNK + 10] ^= 0x11  # both nibbles of one byte in the second chunk
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    for path, data in ((a, raw), (b, changed)):
        torch.save({"f4": data.view(torch.float4_e2m1fn_x2), "bits": data.view(torch.bits8),
                    "f4_t": data[:6].view(torch.float4_e2m1fn_x2).reshape(2, 3).t(),
                    "bits_t": data[:6].view(torch.bits8).reshape(2, 3).t()}, path)
    r = cli("diff", "--values", "--json", str(a), str(b))
    assert r.code == 1, r.err
    values = {v["key"]: v for v in json.loads(r.out)["values"]}
    assert (values["f4"]["numel"], values["f4"]["mismatched"]) == (2 * n, 2)
    assert (values["bits"]["numel"], values["bits"]["mismatched"]) == (n, 1)
    assert values["f4_t"]["passed"] and values["bits_t"]["passed"]
    out = tmp_path / "out.pth"
    assert cli("migrate", str(a), "-o", str(out)).code == 0
    got, want = _torch_dumps([out, a])
    assert got == want


@pytest.mark.parametrize(("dtype", "first"), [("float8_e8m0fnu", "2.7"), ("float4_e2m1fn_x2", "2.8")])
def test_weights_only_under_an_older_torch_needs_the_release_that_added_the_dtype(tmp_path, dtype, first):
    """--torch-version: a torch without the dtype has no such global to allow, so its restricted loader
    refuses the file; from the release that added it on, the dtype is in torch's allowlist."""
    path = tmp_path / "x.pth"
    torch.save({"w": torch.zeros(2, dtype=torch.uint8).view(getattr(torch, dtype))}, path)
    before = f"2.{int(first.split('.')[1]) - 1}"
    for version, loads in (("2.6", False), (before, False), (first, True), ("2.13", True)):
        r = cli("inspect", "--json", "--torch-version", version, str(path))
        assert r.code == 0, r.err
        wo = json.loads(r.out)["weights_only"]
        assert (wo["loads"], wo["needs"]) == (loads, [] if loads else [f"torch.{dtype}"]), version


@pytest.mark.parametrize(("key", "label", "numel"), [
    ("bits8", "uint8", 4), ("bits16", "uint16", 4), ("bits4x2", "uint8", 4), ("float4_e2m1fn_x2", "float32", 8),
    ("qint8", "float32", 4), ("quint4x2", "float32", 4), ("float8_e4m3fn", "float32", 4)])
def test_diff_says_what_the_values_were_compared_as(pairs, key, label, numel):
    """Identical pairs (the byte fast path) and differing ones (torch) report the same figures' basis."""
    for b in pairs[key]:
        r = cli("diff", "--values", "--json", str(pairs[key][0]), str(b))
        (v,) = json.loads(r.out)["values"]
        assert (v["compared_as"], v["numel"]) == (label, numel), b


@pytest.mark.parametrize("key", ALL)
def test_scan_and_gate_of_each_dtype(pairs, key):
    """Per dtype: scan calls it safe, the gate passes it; --strict fails only on a dtype outside the usual set,
    naming it (the policy the contract states: a warning under --strict)."""
    from ckpt_tool.commands.gate.checks import USUAL_DTYPES

    path = str(pairs[key][0])
    scan = cli("scan", "--json", path)
    assert scan.code == 0 and json.loads(scan.out)["files"][0]["verdict"] == "safe", scan.err
    gate = cli("gate", "--json", path)
    assert gate.code == 0, gate.out
    strict = cli("gate", "--strict", "--json", path)
    checks = {c["name"]: c for c in json.loads(strict.out)["files"][0]["checks"]}
    dtype = "qint8" if key == "qint8_per_channel" else key
    if dtype in USUAL_DTYPES:
        assert strict.code == 0, strict.out
    else:
        assert strict.code == 1 and f"unusual dtypes: {dtype} x1" in checks["warnings"]["detail"]
