"""Tensor bytes and the torch objects made of them: reads, NumPy views, packed params, --unsafe loads.

The one place that reads a tensor's data (tensordata.py); what counts as a
tensor in a container (packed.py, torch-free, used by formats/); torch's own
loads for ``--unsafe`` (trusted.py, live.py); quantized tensors rebuilt
(quantized.py). Names are imported on first use (ckpt_tool/lazy.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .live import InMemoryState, in_memory_state, torch_tensor_meta
    from .numpy_reads import npy_pickle_offset
    from .packed import TENSOR_TYPES, is_tensor, packed_items
    from .quantized import flat_state, load_extras, packed_layout, torch_state, value_bytes
    from .tensordata import (
        RAW_CHUNK,
        all_finite,
        check_reads,
        group_reads,
        iter_chunks,
        iter_raw,
        raw_reads,
        same_bytes,
        tensor_bytes,
        to_torch,
        torch_dtype,
    )
    from .trusted import numpy_arrays_as_records, one_line, torch_load_trusted, torchscript_state

EXPORTS: dict[str, tuple[str, ...]] = {
    "tensordata": ("RAW_CHUNK", "all_finite", "check_reads", "group_reads", "iter_chunks", "iter_raw", "raw_reads",
                   "same_bytes", "tensor_bytes", "to_torch", "torch_dtype"),
    "packed": ("TENSOR_TYPES", "is_tensor", "packed_items"),
    "numpy_reads": ("npy_pickle_offset",),
    "live": ("InMemoryState", "in_memory_state", "torch_tensor_meta"),
    "trusted": ("numpy_arrays_as_records", "one_line", "torch_load_trusted", "torchscript_state"),
    "quantized": ("flat_state", "load_extras", "packed_layout", "torch_state", "value_bytes"),
}
__all__ = [  # every name in EXPORTS: tests/tensors/test_surfaces.py checks
    "RAW_CHUNK",
    "TENSOR_TYPES",
    "InMemoryState",
    "all_finite",
    "check_reads",
    "flat_state",
    "group_reads",
    "in_memory_state",
    "is_tensor",
    "iter_chunks",
    "iter_raw",
    "load_extras",
    "npy_pickle_offset",
    "numpy_arrays_as_records",
    "one_line",
    "packed_items",
    "packed_layout",
    "raw_reads",
    "same_bytes",
    "tensor_bytes",
    "to_torch",
    "torch_dtype",
    "torch_load_trusted",
    "torch_state",
    "torch_tensor_meta",
    "torchscript_state",
    "value_bytes",
]
__getattr__ = lazy_exports(__name__, EXPORTS)
