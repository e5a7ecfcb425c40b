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
    from .castloss import CastLoss, cast_tensor, cast_to_bytes, cast_with_loss
    from .closeness import CHUNK, SumFigures, ValueDiff, compare_pair, json_float, worst
    from .histograms import BINS, LOW_EXP, PER_DECADE, SAMPLE, SIDE, add_counts, bin_label, new_counts, sampled
    from .nonfinite import count_raw_nonfinite, nonfinite_counts, tensor_nonfinite
    from .stats import TensorStats, compute_stats
    from .values import compare_values

EXPORTS: dict[str, tuple[str, ...]] = {
    "nonfinite": ("count_raw_nonfinite", "nonfinite_counts", "tensor_nonfinite"),
    "stats": ("TensorStats", "compute_stats"),
    "castloss": ("CastLoss", "cast_tensor", "cast_to_bytes", "cast_with_loss"),
    "histograms": ("BINS", "LOW_EXP", "PER_DECADE", "SAMPLE", "SIDE", "add_counts", "bin_label", "new_counts",
                   "sampled"),
    "closeness": ("CHUNK", "SumFigures", "ValueDiff", "compare_pair", "json_float", "worst"),
    "values": ("compare_values",),
}
__all__ = [  # every name in EXPORTS: tests/tensors/test_surfaces.py checks
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
    "json_float",
    "new_counts",
    "nonfinite_counts",
    "sampled",
    "tensor_nonfinite",
    "worst",
]
__getattr__ = lazy_exports(__name__, EXPORTS)
