"""Fixed-bin histograms of tensor values, accumulated chunk by chunk while ``diff --values`` streams a pair.

The bins are fixed before any value is read (a one-pass stream cannot know a
tensor's range in advance): a signed log scale, four bins per decade of
``|x|`` from 1e-8 to 1e2, one bin for ``|x| < 1e-8`` (zero included) in the
middle, and the outermost bins also hold everything beyond 1e2. NaN and Inf
are not binned (the diff counts them). Each chunk is sampled to at most
``SAMPLE`` evenly spaced elements, so the cost is bounded whatever the
tensor size; the report shows shares, not counts.
"""
from __future__ import annotations

from typing import Any

LOW_EXP = -8  # |x| below 10**LOW_EXP lands in the middle ("zero") bin
HIGH_EXP = 2  # |x| at or above 10**HIGH_EXP lands in the outermost bins
PER_DECADE = 4
SIDE = (HIGH_EXP - LOW_EXP) * PER_DECADE  # bins on each side of zero
BINS = 2 * SIDE + 1
SAMPLE = 1 << 16  # elements of a chunk that are binned, at most


def bin_edges() -> list[float]:
    """The magnitude edges of one side, from 10**LOW_EXP up to 10**HIGH_EXP (SIDE + 1 numbers)."""
    return [10.0 ** (LOW_EXP + k / PER_DECADE) for k in range(SIDE + 1)]


def bin_label(index: int) -> str:
    """A short label for bin ``index`` of BINS (the centre one is ``|x|<1e-8``)."""
    if index == SIDE:
        return f"|x|<1e{LOW_EXP}"
    k = index - SIDE - 1 if index > SIDE else SIDE - 1 - index
    sign = "" if index > SIDE else "-"
    return f"{sign}1e{LOW_EXP + k / PER_DECADE:+.2f}"


def sampled(values: Any) -> Any:
    """At most SAMPLE evenly spaced elements of a 1-d NumPy array (a view)."""
    n = values.shape[0]
    return values if n <= SAMPLE else values[:: -(-n // SAMPLE)]


def add_counts(counts: Any, values: Any) -> None:
    """Add the histogram of ``values`` (1-d float64 NumPy, any NaN/Inf is skipped) to ``counts`` (int64, BINS)."""
    import numpy as np

    x = values[np.isfinite(values)]
    if not x.size:
        return
    mag = np.abs(x)
    with np.errstate(divide="ignore"):
        k = np.floor((np.log10(mag) - LOW_EXP) * PER_DECADE)
    k = np.clip(np.nan_to_num(k, nan=-1.0, neginf=-1.0), -1, SIDE - 1).astype(np.int64)
    idx = np.where(k < 0, SIDE, np.where(x > 0, SIDE + 1 + k, SIDE - 1 - k))
    counts += np.bincount(idx, minlength=BINS)


def new_counts() -> Any:
    import numpy as np

    return np.zeros(BINS, dtype=np.int64)
