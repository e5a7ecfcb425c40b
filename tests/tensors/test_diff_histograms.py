"""The fixed-bin histograms ``diff --values --html`` accumulates while streaming (tensors/histograms.py)."""
from __future__ import annotations

import math

import numpy as np
import torch

from ckpt_tool.tensors.numerics import BINS, LOW_EXP, PER_DECADE, SAMPLE, SIDE, add_counts, bin_label, new_counts


def _bin(x: float) -> int:
    counts = new_counts()
    add_counts(counts, np.array([x], dtype=np.float64))
    (index,) = np.nonzero(counts)[0]
    return int(index)


def test_each_value_lands_in_its_signed_log_bin():
    k_one = (0 - LOW_EXP) * PER_DECADE  # the bin of |x| in [1, 10**0.25)
    assert _bin(1.0) == SIDE + 1 + k_one and _bin(-1.0) == SIDE - 1 - k_one
    assert _bin(1.5) == _bin(1.0) and _bin(2.0) == _bin(1.0) + 1  # 10**0.25 = 1.78
    assert _bin(0.0) == _bin(-0.0) == _bin(1e-9) == SIDE
    assert _bin(1e9) == BINS - 1 and _bin(-1e9) == 0  # beyond 1e2: the outermost bins
    assert bin_label(SIDE) == "|x|<1e-8"


def test_nan_and_inf_are_not_binned_and_counts_add_up():
    counts = new_counts()
    add_counts(counts, np.array([math.nan, math.inf, -math.inf, 0.5, -2.0]))
    assert int(counts.sum()) == 2


def test_a_reports_histograms_cover_the_sampled_finite_elements(tmp_path):
    from ckpt_tool import diff
    from ckpt_tool.commands.diff import ValueView

    torch.manual_seed(0)
    a = torch.randn(1000, 300)  # 300,000 elements: two chunks, the first sampled
    b = a + 0.01 * torch.randn_like(a)
    torch.save({"w": a}, tmp_path / "a.pth")
    torch.save({"w": b}, tmp_path / "b.pth")
    report = diff(str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), values=True, view=ValueView(histograms=1))
    (v,) = report.values
    first, second = 1 << 18, 300_000 - (1 << 18)
    expected = min(first, len(range(0, first, -(-first // SAMPLE)))) + second
    assert sum(v.hist_a) == sum(v.hist_b) == sum(v.hist_diff) == expected
    # B-A is about 0.01: its mass sits around 1e-2, the weights' around 1
    peak = int(np.argmax(np.array(v.hist_diff[SIDE + 1:]) + np.array(v.hist_diff[:SIDE][::-1])))
    assert abs(LOW_EXP + peak / PER_DECADE - math.log10(0.01)) < 0.75


def test_a_pair_that_differs_in_one_chunk_is_binned_whole_and_identical_pairs_not_at_all(tmp_path):
    from ckpt_tool import diff
    from ckpt_tool.commands.diff import ValueView

    torch.manual_seed(3)
    a = torch.randn(3_000_000)  # several 4 MiB reads: all but the last bit-identical
    b = a.clone()
    b[-1] += 1
    torch.save({"w": a, "same": a[:1000].clone()}, tmp_path / "a.pth")
    torch.save({"w": b, "same": a[:1000].clone()}, tmp_path / "b.pth")
    report = diff(str(tmp_path / "a.pth"), str(tmp_path / "b.pth"), values=True, view=ValueView(histograms=8))
    w, same = report.values
    assert sum(w.hist_a) == sum(w.hist_b) > 8 * SAMPLE  # every chunk binned, not only the one that differs
    assert w.hist_diff[SIDE] == sum(w.hist_diff) - 1 or w.hist_diff[SIDE] == sum(w.hist_diff)
    assert same.hist_a == ()  # nothing changed: no bins kept
