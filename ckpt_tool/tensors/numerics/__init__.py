"""What tensor values are: NaN/Inf counts, stats, what a cast lost, and how far two tensors are apart.

The one NaN/Inf counter (nonfinite.py) serves gate, ``inspect --stats``
(stats.py), ``diff --values`` (values.py, closeness.py, histograms.py) and
migrate's cast check (castloss.py); bitwise.py reads the dtypes torch has no
arithmetic for. Names are imported on first use (ckpt_tool/lazy.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .castloss import (
        CastLoss as CastLoss,
        cast_tensor as cast_tensor,
        cast_to_bytes as cast_to_bytes,
        cast_with_loss as cast_with_loss,
        fork_safe as fork_safe,
    )
    from .closeness import (
        CHUNK as CHUNK,
        SumFigures as SumFigures,
        ValueDiff as ValueDiff,
        compare_pair as compare_pair,
        json_float as json_float,
        worst as worst,
    )
    from .histograms import (
        BINS as BINS,
        LOW_EXP as LOW_EXP,
        PER_DECADE as PER_DECADE,
        SAMPLE as SAMPLE,
        SIDE as SIDE,
        add_counts as add_counts,
        bin_label as bin_label,
        new_counts as new_counts,
        sampled as sampled,
    )
    from .nonfinite import (
        count_raw_nonfinite as count_raw_nonfinite,
        nonfinite_counts as nonfinite_counts,
        tensor_nonfinite as tensor_nonfinite,
    )
    from .stats import TensorStats as TensorStats, compute_stats as compute_stats
    from .values import compare_values as compare_values

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "castloss": ("CastLoss", "cast_tensor", "cast_to_bytes", "cast_with_loss", "fork_safe"),
    "closeness": ("CHUNK", "SumFigures", "ValueDiff", "compare_pair", "json_float", "worst"),
    "histograms": (
        "BINS", "LOW_EXP", "PER_DECADE", "SAMPLE", "SIDE", "add_counts", "bin_label", "new_counts", "sampled",
    ),
    "nonfinite": ("count_raw_nonfinite", "nonfinite_counts", "tensor_nonfinite"),
    "stats": ("TensorStats", "compute_stats"),
    "values": ("compare_values",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "BINS",
    "CHUNK",
    "LOW_EXP",
    "PER_DECADE",
    "SAMPLE",
    "SIDE",
    "CastLoss",
    "SumFigures",
    "TensorStats",
    "ValueDiff",
    "add_counts",
    "bin_label",
    "cast_tensor",
    "cast_to_bytes",
    "cast_with_loss",
    "compare_pair",
    "compare_values",
    "compute_stats",
    "count_raw_nonfinite",
    "fork_safe",
    "json_float",
    "new_counts",
    "nonfinite_counts",
    "sampled",
    "tensor_nonfinite",
    "worst",
]
