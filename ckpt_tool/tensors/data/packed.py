"""What counts as a tensor in a container, and the tensors inside a quantized module's packed params.

Below formats/ so that both the state_dict locator (formats/checkpoint/locate.py)
and the torch adapter (quantized.py, on a real module's state_dict) ask the same rule.
"""
from __future__ import annotations

import sys

from ...model import TensorMeta
from ...pickles.unpickle import LazyTensor, NumpyArray, SubclassTensor

TENSOR_TYPES = (LazyTensor, TensorMeta, NumpyArray, SubclassTensor)  # what is_tensor accepts without a closer look
PACKED_SUFFIX = "_packed_params"


def is_tensor(obj: object) -> bool:
    """A tensor record, a NumPy array of numbers, or (after an --unsafe load) a real torch.Tensor."""
    if isinstance(obj, TENSOR_TYPES):
        # NumPy arrays of strings/objects/big-endian data are metadata, not tensors
        return not isinstance(obj, NumpyArray) or obj.dtype is not None
    torch = sys.modules.get("torch")  # looked up, never imported: only an --unsafe load holds real tensors
    return torch is not None and isinstance(obj, torch.Tensor)


def packed_items(key: str, value: object) -> list[tuple[str, object]] | None:
    """The tensors inside a quantized module's packed params entry, under ``KEY.0``, ``KEY.1``, or None.

    ``torch.ao`` quantized and dynamic-quantized Linear layers save
    ``PREFIX._packed_params._packed_params`` as a tuple (qint8 weight, float
    bias or None): these are tensors of the state_dict like any other, listed,
    migrated and compared by their position in the tuple.
    """
    if not key.endswith(PACKED_SUFFIX) or not isinstance(value, (tuple, list)) or type(value) not in (tuple, list):
        return None
    if not value or len(value) > 8:
        return None
    if not all(v is None or is_tensor(v) for v in value) or all(v is None for v in value):
        return None
    return [(f"{key}.{i}", v) for i, v in enumerate(value) if v is not None]
