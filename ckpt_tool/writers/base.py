"""What every writer consumes: output tensors that point at their source bytes.

An ``OutTensor`` is one entry of the output state_dict: its new key, the
source tensor it comes from and the dtype it is written in. Its bytes are
read from the source only while it is written (and again when verified):
sourcebytes.py reads them, output.py appends them to the output file.
"""
from __future__ import annotations

from math import prod

from .. import dtypes
from ..errors import InputError
from ..model import TensorMeta, contiguous_strides
from ..tensors.numerics import CastLoss

CHUNK = 1 << 20  # bytes per read/write: large enough for disk speed, small enough to stay in a core's cache
# (and at most this much per write(): on Linux 6.x ext4 a larger write() fills the page cache with large folios,
# whose allocation made the whole write 2-5x slower on the VMs we measure on: docs/consolidate.md, Figures)
_BY_NAME = dtypes.BY_NAME


class OutTensor:
    """One tensor of the output: ``key`` in ``dtype``, holding ``source``'s values.

    A plain __slots__ class with its sizes computed once: migrate makes one
    per tensor and reads these fields several times each.
    """

    __slots__ = (
        "_loc",
        "_view",
        "cast",
        "dtype",
        "itemsize",
        "key",
        "loss",
        "nbytes",
        "numel",
        "shape",
        "source",
        "streamable",
    )

    def __init__(self, key: str, source: TensorMeta, dtype: str) -> None:
        self.key = key
        self.source = source
        self.dtype = dtype
        self.shape = source.shape
        self.numel = numel = prod(source.shape)
        out_dt = _BY_NAME.get(dtype) or dtypes.lookup(dtype)
        self.nbytes = numel * out_dt.itemsize
        self.cast = dtype != source.dtype
        # element size in the source (offsets into its storage are counted in these)
        self.itemsize = (_BY_NAME.get(source.dtype) or dtypes.lookup(source.dtype)).itemsize if self.cast \
            else out_dt.itemsize
        # True when the bytes can be copied straight from the source
        self.streamable = not self.cast and source.storage is not None and source.is_contiguous
        self._view: object = False
        self._loc: object = False  # sourcebytes.small_location's answer, once asked (writing and verifying both ask)
        self.loss: CastLoss | None = None  # what the cast did to the values, counted when it was first cast

    def view_key(self) -> tuple[object, ...] | None:
        """Identity of the exact values: equal keys mean the same view of the same storage."""
        if self._view is False:
            s = self.source
            if s.storage is None:
                self._view = None
            else:
                stride = s.stride if s.stride is not None else contiguous_strides(s.shape)
                self._view = (id(s.storage.source), s.storage.key, s.dtype, s.storage_offset, s.shape,
                              stride if self.numel > 1 else None, self.dtype)
        return self._view  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"OutTensor({self.key!r} <- {self.source.key!r}, {self.dtype}{list(self.shape)})"


def require_data(t: OutTensor) -> None:
    if t.source.storage is None:
        raise InputError(f"tensor {t.source.key!r} holds no data (it was saved on the meta device); "
                         "drop it with --drop or choose another source")

