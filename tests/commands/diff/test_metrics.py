"""``ckpt diff --values`` figures per tensor, checked against torch's own computation on real torch files.

A small model trained a few steps (diff_training.py) is saved at two steps; every figure the diff reports
for each tensor must equal what torch computes from the two loaded state_dicts (float64, flattened).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from diff_training import train

from ckpt_tool import diff

ATOL, RTOL = 1e-8, 1e-5


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    return train(tmp_path_factory.mktemp("run"))


def expected(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL, rtol: float = RTOL) -> dict[str, float]:
    """Each figure as torch computes it: max/mean |B-A|, ||B-A||/||A||, cosine_similarity, share outside tol."""
    x, y = a.double().flatten(), b.double().flatten()
    d = (y - x).abs()
    fin = torch.isfinite(x) & torch.isfinite(y)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "rel_l2": float(torch.linalg.vector_norm(y - x) / torch.linalg.vector_norm(x)),
        "cosine": float(F.cosine_similarity(x[fin], y[fin], dim=0)),
        "mismatched_share": float((~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)).double().mean()),
        "max_rel": float((d / y.abs()).max()),
        "norm_a": float(torch.linalg.vector_norm(x[fin])),
    }


def values_json(run_cli, a, b, *extra):
    r = run_cli("diff", "--values", "--json", str(a), str(b), *extra)
    assert r.code in (0, 1), r
    return r.code, json.loads(r.out)


def test_every_figure_equals_torchs_own_computation(steps, run_cli):
    code, doc = values_json(run_cli, steps[3], steps[6])
    sa, sb = torch.load(steps[3]), torch.load(steps[6])
    assert code == 1 and len(doc["values"]) == len(sa) == doc["values_total"]
    for v in doc["values"]:
        want = expected(sa[v["key"]], sb[v["key"]])
        for name in ("mean_abs", "rel_l2", "cosine", "mismatched_share", "norm_a"):
            assert v[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), (v["key"], name)
        # max_abs / max_rel: in the compared dtype (float32 here), as torch.allclose judges them
        assert v["max_abs"] == pytest.approx(want["max_abs"], rel=1e-6), v["key"]
        assert v["max_rel"] == pytest.approx(want["max_rel"], rel=1e-5), v["key"]
        assert v["mismatched"] == round(want["mismatched_share"] * v["numel"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_figures_in_other_dtypes_equal_torchs(tmp_path, run_cli, dtype):
    # bf16 and int64 go through torch, fp16/fp64 through NumPy: the figures must not depend on the path
    torch.manual_seed(1)
    if dtype.is_floating_point:
        a = torch.randn(700, 500).to(dtype)
        b = (a.double() + 0.01 * torch.randn(700, 500, dtype=torch.float64)).to(dtype)
    else:
        a = torch.randint(-50, 50, (700, 500), dtype=dtype)
        b = a + torch.randint(0, 2, (700, 500), dtype=dtype)
    torch.save({"w": a}, tmp_path / "a.pth")
    torch.save({"w": b}, tmp_path / "b.pth")
    _, doc = values_json(run_cli, tmp_path / "a.pth", tmp_path / "b.pth")
    (v,) = doc["values"]
    want = expected(a, b)
    for name in ("mean_abs", "rel_l2", "cosine", "mismatched_share"):
        assert v[name] == pytest.approx(want[name], rel=1e-9), name


def _pair(tmp_path, a, b):
    torch.save({"t": a}, tmp_path / "a.pth")
    torch.save({"t": b}, tmp_path / "b.pth")
    return diff(str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), values=True).values[0]


@pytest.mark.parametrize("where", [0, 150_000, 299_999])  # in the first, a middle or the last chunk
def test_inf_in_b_is_an_infinite_relative_difference_in_any_chunk(tmp_path, where):
    # regression: max_rel was 0.0 when B held inf (inf/inf is NaN, and Python's max(0.0, nan) keeps 0.0)
    a = torch.linspace(-1, 1, 300_000)
    b = a.clone()
    b[where] = math.inf
    v = _pair(tmp_path, a, b)
    assert v.max_rel == math.inf and v.max_abs == math.inf and v.mean_abs == math.inf and v.rel_l2 == math.inf
    assert (v.inf_a, v.inf_b, v.mismatched, v.passed) == (0, 1, 1, False)
    fin = torch.isfinite(b)
    assert v.cosine == pytest.approx(float(F.cosine_similarity(a[fin].double(), b[fin].double(), dim=0)), rel=1e-12)


@pytest.mark.parametrize("case", ["nan_in_b", "nan_in_a", "inf_in_a", "opposite_infs"])
def test_every_non_finite_mismatch_is_infinite_not_lost(tmp_path, case):
    # the class of the bug: a NaN made along the way (x/NaN, inf/inf, inf-inf) must never vanish in a max
    a = torch.arange(1, 11, dtype=torch.float32)
    b = a.clone()
    if case == "nan_in_b":
        b[4] = math.nan
    elif case == "nan_in_a":
        a[4] = math.nan
    elif case == "inf_in_a":
        a[4] = math.inf
    else:
        a[4], b[4] = math.inf, -math.inf
    v = _pair(tmp_path, a, b)
    assert v.max_abs == math.inf and v.max_rel == math.inf and v.rel_l2 == math.inf, v
    assert v.mismatched == 1 and not v.passed


def test_same_nan_and_inf_on_both_sides_are_equal(tmp_path):
    a = torch.tensor([1.0, math.nan, math.inf, -math.inf, 0.0])
    v = _pair(tmp_path, a, a.clone())
    assert (v.max_abs, v.max_rel, v.mean_abs, v.rel_l2, v.cosine, v.mismatched) == (0, 0, 0, 0, 1.0, 0)
    assert (v.nan_a, v.nan_b, v.inf_a, v.inf_b, v.passed) == (1, 1, 2, 2, True)


def test_identical_tensors_have_zero_change_and_cosine_one(steps, run_cli):
    code, doc = values_json(run_cli, steps[3], steps[3])
    assert code == 0 and doc["equal"]
    for v in doc["values"]:
        assert (v["max_abs"], v["mean_abs"], v["rel_l2"], v["cosine"], v["mismatched_share"]) == (0, 0, 0, 1, 0)


def test_zero_norm_sides_follow_torch(tmp_path):
    # A all zeros, B not: rel_l2 is inf and cosine is torch's eps rule (0), not a NaN
    a, b = torch.zeros(8), torch.ones(8)
    v = _pair(tmp_path, a, b)
    assert v.rel_l2 == math.inf
    assert v.cosine == float(F.cosine_similarity(a.double(), b.double(), dim=0)) == 0.0


def test_json_keys_of_each_value(steps, run_cli):
    _, doc = values_json(run_cli, steps[3], steps[6])
    for key in ("key", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine", "mismatched", "mismatched_share",
                "numel", "nan_a", "nan_b", "inf_a", "inf_b", "passed", "compared_as"):
        assert key in doc["values"][0], key
    assert doc["value_mismatch"][0].keys() >= {"key", "max_abs", "max_rel"}
    assert doc["sort"] is None and doc["top"] is None and doc["rollups"] is None


def test_exit_codes_are_unchanged(steps, run_cli):
    assert run_cli("diff", "--values", str(steps[3]), str(steps[6])).code == 1
    assert run_cli("diff", "--values", str(steps[3]), str(steps[3])).code == 0
    # without --values the weights' differences are not looked at: no key/shape/dtype difference is exit 0
    r = run_cli("diff", str(steps[3]), str(steps[6]))
    assert r.code == 0
    assert r.out.strip().endswith(
        "result: no key, shape or dtype differences (values not compared; --values compares them)")
    r = run_cli("diff", "--values", str(steps[3]), str(steps[3]))
    assert r.out.strip().endswith("result: no differences (keys, shapes, dtypes and values)")


def test_text_table_has_a_header_for_every_column(steps, run_cli):
    r = run_cli("diff", "--values", str(steps[3]), str(steps[6]))
    lines = r.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("key"))
    names = lines[head].split()
    assert names[:6] == ["key", "max_abs", "max_rel", "mean_abs", "rel_l2", "cosine"] and names[-1] == "result"
    # every column of the first row sits under a header: as many header cells as the dashes drawn
    assert len(lines[head + 1].split()) == len(lines[head].split("  ")) - lines[head].split("  ").count("")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pair_that_differs_in_one_chunk_only_counts_the_identical_chunks_norms(tmp_path, run_cli, dtype):
    # 3M elements: several 4 MiB reads; only the last element differs, the earlier chunks are bit-identical
    torch.manual_seed(2)
    a = torch.randn(3_000_000).to(dtype)
    b = a.clone()
    b[-1] += 1
    _, doc = values_json(run_cli, _save(tmp_path, "a", a), _save(tmp_path, "b", b))
    (v,) = doc["values"]
    want = expected(a, b)
    for name in ("rel_l2", "cosine", "mean_abs", "norm_a"):
        assert v[name] == pytest.approx(want[name], rel=1e-9), name


def _save(folder, name, t):
    path = folder / f"{name}.pth"
    torch.save({"w": t}, path)
    return path
