"""The one NaN/Inf counter (tensors/numerics/nonfinite.py) against torch's own count, float8 included.

torch has no isinf/isfinite kernel for float8_e4m3fn: each user of the
counter (gate, inspect --stats, diff --values, migrate's cast check) must
still count such tensors, and count them as torch does on the widened values.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from ckpt_tool.formats import load
from ckpt_tool.tensors.numerics import (
    compare_pair,
    compute_stats,
    count_raw_nonfinite,
    nonfinite_counts,
    tensor_nonfinite,
)

FLOAT8 = ["float8_e4m3fn", "float8_e5m2"]
WIDE = ["float16", "bfloat16", "float32", "float64"]
VALUES = [1.0, -2.5, float("nan"), float("inf"), -float("inf"), 0.0, 3.0, float("nan")]


def _torch_count(x: torch.Tensor) -> tuple[int, int]:
    wide = x.to(torch.float32)
    return int(torch.isnan(wide).sum()), int(torch.isinf(wide).sum())


def _tensor(dtype: str, n: int = 1) -> torch.Tensor:
    return torch.tensor(VALUES * n).to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", [*FLOAT8, *WIDE])
def test_the_counter_agrees_with_torch(dtype):
    x = _tensor(dtype)
    want = _torch_count(x)
    assert want[0] >= 2  # e4m3fn turns inf into NaN, e5m2 keeps it: either way something to count
    assert tensor_nonfinite(x) == want
    assert count_raw_nonfinite(x.view(torch.uint8).numpy().tobytes(), dtype) == want


@pytest.mark.parametrize("dtype", FLOAT8)
def test_finite_float8_counts_nothing(dtype):
    x = torch.tensor([1.0, -2.0, 0.5, 0.0]).to(getattr(torch, dtype))
    assert tensor_nonfinite(x) == (0, 0) == count_raw_nonfinite(x.view(torch.uint8).numpy().tobytes(), dtype)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_every_user_counts_float8(tmp_path, dtype):
    x = _tensor(dtype, 1000)  # several chunks of the batched and streamed paths
    path = tmp_path / "f8.safetensors"
    save_file({"w": x, "ok": torch.zeros(4).to(x.dtype)}, str(path))
    ckpt = load(str(path))
    by_key = {t.key: t for t in ckpt.tensors}
    want = _torch_count(x)
    gate = {t.key: (nan, inf) for t, nan, inf in nonfinite_counts(list(ckpt.tensors))}  # gate's no_nan_inf
    assert gate == {"w": want, "ok": (0, 0)}
    stats = compute_stats(by_key["w"])  # inspect --stats
    assert (stats.nan, stats.inf) == want
    finite = x.to(torch.float64)[torch.isfinite(x.to(torch.float64))]
    assert stats.min == float(finite.min()) and stats.max == float(finite.max())
    same = compare_pair(by_key["w"], by_key["w"], atol=0.0, rtol=0.0)  # diff --values, bit-identical chunks
    assert (same.nan_a, same.inf_a, same.nan_b, same.inf_b) == (*want, *want) and same.passed


def test_diff_values_of_float8_with_nan_is_a_finding_not_a_crash(tmp_path, run_cli):
    x = _tensor("float8_e4m3fn", 10)
    save_file({"w": x}, str(tmp_path / "a.safetensors"))
    y = x.clone()
    y[0] = 2.0
    save_file({"w": y}, str(tmp_path / "b.safetensors"))
    save_file({"w": x}, str(tmp_path / "c.safetensors"))
    same = run_cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "c.safetensors"), "--values")
    assert same.code == 0, same
    differs = run_cli("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--values")
    assert differs.code == 1, differs
