"""The fast paths behind the benchmarks give exactly the answers of the slow ones.

Each test pits a speed-up (bit-level NaN test, memcmp equality, read-ahead
thread, NumPy value diff, batched checks, tabulate-free tables, batched zip
header reads) against the straightforward computation on real files.
No timings here: speed is measured in benchmarks/, correctness here.
"""
from __future__ import annotations

import importlib
import os
import random
import string

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tool.formats import load
from ckpt_tool.io.zip.archive import ZipArchive
from ckpt_tool.render.common import simple_table
from ckpt_tool.tensors.data import all_finite, check_reads, iter_raw, raw_reads, same_bytes, tensor_bytes

diff_mod = importlib.import_module("ckpt_tool.tensors.numerics.values")
nonfinite_mod = importlib.import_module("ckpt_tool.tensors.numerics.nonfinite")

FLOATS = ["float16", "bfloat16", "float32", "float64", "complex64", "complex128",
          "float8_e5m2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2fnuz"]


@pytest.mark.parametrize("name", FLOATS)
def test_all_finite_agrees_with_torch_isfinite_on_every_bit_pattern_kind(name):
    dtype = getattr(torch, name)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    rng = random.Random(name)
    for _ in range(400):
        raw = bytes(rng.randrange(256) for _ in range(itemsize * rng.randint(1, 5)))
        x = torch.frombuffer(bytearray(raw), dtype=dtype)
        expected = bool(torch.isfinite(x.float() if itemsize == 1 else x).all())
        assert all_finite(raw, name) is expected, (name, raw.hex())


def test_all_finite_has_no_answer_for_integers():
    assert all_finite(b"\xff" * 8, "int64") is None


def test_all_finite_finds_one_nan_in_a_large_buffer():
    x = torch.randn(3_000_000, dtype=torch.float16)
    x[2_999_999] = float("nan")
    raw = x.view(torch.uint8).numpy().tobytes()
    assert all_finite(raw, "float16") is False
    assert all_finite(raw[:-2], "float16") is True


def test_same_bytes_on_views_and_slices():
    a, b = bytearray(os.urandom(1003)), bytearray()
    b[:] = a
    assert same_bytes(memoryview(a), memoryview(b))
    assert same_bytes(memoryview(a)[:1001], memoryview(b)[:1001])  # not whole buffers: compared as words
    b[1000] ^= 1
    assert not same_bytes(memoryview(a), memoryview(b))
    assert not same_bytes(memoryview(a)[:1001], memoryview(b)[:1001])
    assert same_bytes(memoryview(a)[:1000], memoryview(b)[:1000])
    assert not same_bytes(b"ab", b"abc")


@pytest.mark.parametrize("at", [0, 4095, 5000, 9999])
def test_same_bytes_on_large_views_finds_one_flipped_bit(at):
    a = bytearray(os.urandom(12_000))
    b = bytearray(a)
    assert same_bytes(memoryview(a)[:10_000], memoryview(b)[:10_000])  # parts of buffers: libc memcmp
    b[at] ^= 0x80
    assert not same_bytes(memoryview(a)[:10_000], memoryview(b)[:10_000])
    assert same_bytes(memoryview(a)[at + 1:10_000], memoryview(b)[at + 1:10_000])


def _checkpoint(tmp_path, tensors, name="t.safetensors"):
    path = tmp_path / name
    if name.endswith(".safetensors"):
        save_file(tensors, str(path))
    else:
        torch.save(tensors, str(path))
    return load(path)


@pytest.mark.parametrize("name", ["t.safetensors", "t.pth"])
def test_check_reads_yields_every_byte_in_order_across_chunk_boundaries(tmp_path, name):
    tensors = {f"w{i}": torch.randn(n) for i, n in enumerate([1, 1000, 4096, 7, 100_000])}
    ckpt = _checkpoint(tmp_path, tensors, name)
    with ckpt:
        reads = [(r,) for t in ckpt.tensors for r in raw_reads(t, 4096)]
        got: dict[str, bytearray] = {}
        for ((t, _, _),), view in zip(reads, check_reads(reads, lambda i, v: bytes(v), chunk_bytes=4096), strict=True):
            got.setdefault(t.key, bytearray()).extend(view)
        assert {k: bytes(v) for k, v in got.items()} == {t.key: tensor_bytes(t) for t in ckpt.tensors}


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_check_reads_gives_every_result_in_order(tmp_path, workers):
    tensors = {f"w{i}": torch.randn(n) for i, n in enumerate([1, 1000, 4096, 7, 100_000, 30_000])}
    a = _checkpoint(tmp_path, tensors, "a.pth")
    b = _checkpoint(tmp_path, {k: v.flip(0) for k, v in tensors.items()}, "b.safetensors")
    reads = [r for t in a.tensors for r in zip(raw_reads(t, 4096), raw_reads(b.by_key[t.key], 4096), strict=True)]
    assert len(reads) > 20

    def check(i, x, y):  # runs on the worker threads: copies, so the reused buffers may change later
        return i, bytes(x), bytes(y)

    got = list(check_reads(reads, check, workers=workers, chunk_bytes=4096))
    assert [g[0] for g in got] == list(range(len(reads)))
    for (ra, rb), (_, x, y) in zip(reads, got, strict=True):
        (ta, oa, la), (tb, ob, lb) = ra, rb
        assert x == tensor_bytes(ta)[oa:oa + la] and y == tensor_bytes(tb)[ob:ob + lb]
    skipped = list(check_reads(reads, check, skip=lambda i: i % 3 == 0, workers=workers, chunk_bytes=4096))
    assert [r is None for r in skipped] == [i % 3 == 0 for i in range(len(reads))]
    assert list(check_reads([], check, workers=workers)) == []


def test_check_reads_hands_an_error_to_the_caller_and_stops(tmp_path):
    a = _checkpoint(tmp_path, {"a": torch.randn(100_000), "b": torch.randn(10)}, "a.safetensors")
    b = _checkpoint(tmp_path, {"a": torch.randn(100_000), "b": torch.randn(10)}, "b.safetensors")
    os.truncate(b.path, 1000)
    reads = [r for t in a.tensors for r in zip(raw_reads(t, 4096), raw_reads(b.by_key[t.key], 4096), strict=True)]
    with pytest.raises(Exception) as info:
        for _ in check_reads(reads, lambda i, x, y: same_bytes(x, y), workers=2, chunk_bytes=4096):
            pass
    assert "truncated" in str(info.value)

    def fail(i, x, y):
        raise ValueError(f"check {i} failed")

    whole = [r for t in a.tensors for r in zip(raw_reads(t, 4096), raw_reads(t, 4096), strict=True)]
    with pytest.raises(ValueError, match="check"):
        list(check_reads(whole, fail, workers=2, chunk_bytes=4096))


def test_check_reads_closed_early_does_not_hang(tmp_path):
    t = _checkpoint(tmp_path, {"a": torch.randn(1_000_000)}).tensors[0]
    results = check_reads(list(zip(raw_reads(t, 4096), raw_reads(t, 4096), strict=True)),
                          lambda i, x, y: same_bytes(x, y),
                          workers=2, chunk_bytes=4096)
    assert next(results) is True
    results.close()


def test_iter_raw_with_a_buffer_gives_the_same_bytes(tmp_path):
    ckpt = _checkpoint(tmp_path, {"a": torch.randn(12345)})
    t = ckpt.tensors[0]
    buf = bytearray(1000)
    assert b"".join(bytes(v) for v in iter_raw(t, 1000, buf)) == tensor_bytes(t)


_SUMS = ("sum_abs", "sq_diff", "sq_a", "sq_b", "dot")  # float64 sums: the two paths add in other orders


def assert_same_diff(x, y):
    """Two ValueDiffs equal, the float64 sums to the last few bits (NumPy and torch sum in other orders)."""
    import dataclasses
    import math

    assert x is not None and y is not None
    fx, fy = dataclasses.asdict(x), dataclasses.asdict(y)
    for name in _SUMS:
        assert math.isclose(fx.pop(name), fy.pop(name), rel_tol=1e-12, abs_tol=1e-300), (x.key, name)
    assert fx == fy


@pytest.mark.parametrize("da,db", [("float16", "float16"), ("float16", "float32"), ("float32", "float64"),
                                   ("float64", "float16")])
def test_numpy_value_diff_equals_the_torch_one(tmp_path, da, db):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(50_000, generator=gen) * 3).to(getattr(torch, da))
    y = (x.double() + torch.randn(50_000, generator=gen).double() * 1e-3).to(getattr(torch, db))
    y[:10] = 0  # relative difference against zero: inf
    x[10:20] = 0
    y[10:20] = 0  # 0/0: equal
    a = _checkpoint(tmp_path, {"w": x}, "a.safetensors").tensors[0]
    b = _checkpoint(tmp_path, {"w": y}, "b.safetensors").tensors[0]
    for atol, rtol in [(1e-8, 1e-5), (1e-3, 1e-2), (0.0, 0.0), (10.0, 0.0)]:
        assert_same_diff(diff_mod._numpy_pair(a, b, atol=atol, rtol=rtol, norms=True),
                         diff_mod.compare_pair(a, b, atol=atol, rtol=rtol))


def test_numpy_value_diff_leaves_nan_and_inf_to_torch(tmp_path):
    x = torch.randn(1000)
    y = x.clone()
    y[3] = float("inf")
    a = _checkpoint(tmp_path, {"w": x}, "a.safetensors").tensors[0]
    b = _checkpoint(tmp_path, {"w": y}, "b.safetensors").tensors[0]
    assert diff_mod._numpy_pair(a, b, atol=1e-8, rtol=1e-5) is None
    same = _checkpoint(tmp_path, {"w": y}, "c.safetensors").tensors[0]
    assert diff_mod._numpy_pair(b, same, atol=1e-8, rtol=1e-5) is None  # identical, but not finite


def test_many_small_pairs_get_the_same_verdicts_as_one_by_one(tmp_path):
    gen = torch.Generator().manual_seed(2)
    a = {f"t{i}": torch.randn(16, generator=gen) for i in range(3000)}
    b = {k: v.clone() for k, v in a.items()}
    b["t5"][0] += 1  # differs
    a["t7"][1] = b["t7"][1] = float("nan")  # identical but not finite
    b["t2999"] = b["t2999"].double().float() + 0  # identical
    ca = _checkpoint(tmp_path, a, "a.pth")
    cb = _checkpoint(tmp_path, b, "b.safetensors")
    pairs = [(t, cb.by_key[t.key]) for t in ca.tensors]
    quick = diff_mod._quick_diffs(pairs, atol=1e-8, rtol=1e-5, norms=False, histograms=False)
    verdicts = dict(zip((ta.key for ta, _ in pairs), quick, strict=True))
    assert verdicts["t5"] is None and verdicts["t7"] is None  # left to the one-by-one pass
    assert sum(v is not None and v.passed and v.max_abs == 0 for v in verdicts.values()) == len(pairs) - 2
    values, _ = diff_mod.compare_values(pairs, atol=1e-8, rtol=1e-5)
    by_key = {v.key: v for v in values}
    assert [v.key for v in values] == [ta.key for ta, _ in pairs]  # order kept
    assert not by_key["t5"].passed and by_key["t7"].nan_a == 1 and by_key["t7"].passed


def test_large_pairs_compared_where_read_equal_the_torch_comparison(tmp_path):
    # pairs over _SMALL_PAIR bytes, several read-ahead chunks long: differing float pairs are
    # compared from the chunks already read; NaN/Inf or other dtypes are left to compare_pair
    gen = torch.Generator().manual_seed(3)
    n = 3_000_000  # 6-12 MB: two or more 4 MiB read-ahead chunks
    a = {"f16": torch.randn(n, generator=gen).half(), "f32": torch.randn(n, generator=gen),
         "same": torch.randn(n, generator=gen), "nan": torch.randn(n, generator=gen),
         "bf16": torch.randn(n, generator=gen).bfloat16(), "late": torch.randn(n, generator=gen)}
    b = {k: v.clone() for k, v in a.items()}
    b["f16"][::7] += 0.01
    b["f32"][5] = 0.0  # relative difference against zero: inf
    b["nan"][-1] = float("nan")  # differs in its last chunk only
    b["bf16"][1] += 1
    b["late"][-3:] += 1e-3  # only the last chunk differs
    ca = _checkpoint(tmp_path, a, "a.safetensors")
    cb = _checkpoint(tmp_path, b, "b.safetensors")
    pairs = [(t, cb.by_key[t.key]) for t in ca.tensors]
    assert all(t.nbytes > (4 << 20) for t, _ in pairs)  # two chunks or more each
    diffs = diff_mod._quick_diffs(pairs, atol=1e-8, rtol=1e-5, norms=True, histograms=False)
    quick = dict(zip((ta.key for ta, _ in pairs), diffs, strict=True))
    assert quick["nan"] is None and quick["bf16"] is None
    for ta, tb in pairs:
        if quick[ta.key] is not None:
            assert_same_diff(quick[ta.key], diff_mod.compare_pair(ta, tb, atol=1e-8, rtol=1e-5))
    assert quick["same"].max_abs == 0 and quick["same"].passed
    assert not quick["f16"].passed and quick["f32"].max_rel == float("inf") and not quick["late"].passed
    values, _ = diff_mod.compare_values(pairs, atol=1e-8, rtol=1e-5)
    assert [v.key for v in values] == [ta.key for ta, _ in pairs]
    assert {v.key: v for v in values}["nan"].nan_b == 1


def test_nan_check_of_large_tensors_counts_every_chunk_like_torch(tmp_path):
    # several 4 MiB chunks per tensor, checked on worker threads: counts summed in order, per tensor
    gen = torch.Generator().manual_seed(4)
    tensors = {f"w{i}": torch.randn(2_500_000, generator=gen) for i in range(4)}
    tensors["w0"][[5, 1_500_000, -1]] = float("nan")  # in the first, second and last chunk
    tensors["w2"][2_000_000] = float("-inf")
    tensors["h"] = torch.randn(5_000_000, generator=gen).half()
    tensors["h"][4_999_999] = float("inf")
    ckpt = _checkpoint(tmp_path, tensors, "big.safetensors")
    counts = {t.key: (n, i) for t, n, i in nonfinite_mod.nonfinite_counts(list(ckpt.tensors))}
    assert counts == {k: (int(v.isnan().sum()), int(v.isinf().sum())) for k, v in tensors.items()}
    assert counts["w0"] == (3, 0) and counts["w2"] == (0, 1) and counts["h"] == (0, 1)


def test_batched_nan_check_names_the_one_bad_small_tensor(tmp_path):
    tensors = {f"t{i}": torch.randn(16) for i in range(2000)}
    tensors["t1234"][3] = float("inf")
    tensors["big"] = torch.randn(300_000)
    tensors["big"][-1] = float("nan")
    ckpt = _checkpoint(tmp_path, tensors, "x.pth")
    counts = {t.key: (n, i) for t, n, i in nonfinite_mod.nonfinite_counts(list(ckpt.tensors))}
    assert counts["t1234"] == (0, 1) and counts["big"] == (1, 0)
    assert sum(n + i for n, i in counts.values()) == 2


def test_simple_table_is_tabulates_simple_format():
    from tabulate import tabulate

    rng = random.Random(3)
    alphabet = string.ascii_letters + "  .[],;_"
    for _ in range(500):
        ncol, nrow = rng.randint(1, 6), rng.randint(0, 6)
        headers = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(0, 8))) for _ in range(ncol)]
        rows = [["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(ncol)]
                for _ in range(nrow)]
        if rows and rng.random() < 0.1:
            rows[0][0] += "\u00e9\u4e2d"  # wide characters: handed to tabulate
        assert simple_table(rows, headers) == tabulate(rows, headers=headers, tablefmt="simple",
                                                       disable_numparse=True)


def test_zip_member_offsets_read_in_blocks_equal_the_one_by_one_ones(tmp_path, monkeypatch):
    path = tmp_path / "many.pth"
    torch.save({f"t{i}": torch.randn(i % 7 + 1) for i in range(500)}, str(path))
    batched = ZipArchive(str(path))
    got = {n: batched.data_offset(n) for n in batched.members}
    monkeypatch.setattr("ckpt_tool.io.zip.archive._BATCH_AFTER", 10**9)
    direct = ZipArchive(str(path))
    assert got == {n: direct.data_offset(n) for n in direct.members}
    batched.close()
    direct.close()
