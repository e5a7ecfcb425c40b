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
    from .live import (
        InMemoryState as InMemoryState,
        in_memory_state as in_memory_state,
        torch_tensor_meta as torch_tensor_meta,
    )
    from .numpy_reads import npy_pickle_offset as npy_pickle_offset
    from .packed import TENSOR_TYPES as TENSOR_TYPES, is_tensor as is_tensor, packed_items as packed_items
    from .quantized import (
        flat_state as flat_state,
        load_extras as load_extras,
        packed_layout as packed_layout,
        torch_state as torch_state,
        value_bytes as value_bytes,
    )
    from .tensordata import (
        RAW_CHUNK as RAW_CHUNK,
        all_finite as all_finite,
        check_reads as check_reads,
        group_reads as group_reads,
        iter_chunks as iter_chunks,
        iter_raw as iter_raw,
        raw_reads as raw_reads,
        same_bytes as same_bytes,
        tensor_bytes as tensor_bytes,
        to_torch as to_torch,
        torch_dtype as torch_dtype,
    )
    from .trusted import (
        numpy_arrays_as_records as numpy_arrays_as_records,
        one_line as one_line,
        torch_load_trusted as torch_load_trusted,
        torchscript_state as torchscript_state,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "live": ("InMemoryState", "in_memory_state", "torch_tensor_meta"),
    "numpy_reads": ("npy_pickle_offset",),
    "packed": ("TENSOR_TYPES", "is_tensor", "packed_items"),
    "quantized": ("flat_state", "load_extras", "packed_layout", "torch_state", "value_bytes"),
    "tensordata": (
        "RAW_CHUNK", "all_finite", "check_reads", "group_reads", "iter_chunks", "iter_raw", "raw_reads", "same_bytes",
        "tensor_bytes", "to_torch", "torch_dtype",
    ),
    "trusted": ("numpy_arrays_as_records", "one_line", "torch_load_trusted", "torchscript_state"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
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
