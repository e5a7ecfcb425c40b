"""What NumPy reads for the torch-free paths: a strided view's bytes in C order, a ``.npy`` header.

NumPy (not torch) is imported here, and only when one of these runs: a
strided DCP chunk (formats/dcp/metadata.py) and a ``.npy`` file the scanner
meets (pickles/scanner.py, which is handed npy_pickle_offset by its callers).
"""
from __future__ import annotations

import io
import warnings

from ...errors import InputError
from ...io import Blob, literal_npy_offset, npy_header
from ...model import TensorMeta


def c_order_bytes(meta: TensorMeta) -> bytes:
    """A tensor's elements in C order; a strided one is gathered byte-wise with NumPy (never torch)."""
    if meta.storage is None:
        raise InputError(meta.no_data())
    if meta.numel == 0:
        return b""
    if meta.is_contiguous:
        return meta.storage.source.read(meta.storage.key, meta.storage_offset * meta.itemsize, meta.nbytes)
    import numpy as np

    start, end = meta.byte_span
    raw = np.frombuffer(meta.storage.source.read(meta.storage.key, start, end - start), dtype=np.uint8)
    size = meta.itemsize
    view = np.lib.stride_tricks.as_strided(
        raw, shape=(*meta.shape, size), strides=(*(s * size for s in (meta.stride or ())), 1), writeable=False)
    return bytes(np.ascontiguousarray(view).tobytes())


def npy_pickle_offset(blob: Blob) -> int | None:
    """Where the pickle of a ``.npy`` object array starts (None: not an object array).

    The header is parsed by NumPy's own reader (``numpy.lib.format``: a
    Python literal read with ``ast.literal_eval``, never evaluated), so every
    spelling ``np.load`` accepts counts: ``'O'``, ``'|O'``, ``'object'``,
    structured dtypes with an object field, subarrays of objects, any header
    version. ``np.load(allow_pickle=True)`` unpickles the data of any dtype
    with ``hasobject``; without NumPy installed, a literal parse stands in
    (io/containers.literal_npy_offset).
    """
    major, minor, start, hlen = npy_header(blob)
    try:
        import numpy
        from numpy.lib import format as npformat
    except ImportError:
        return literal_npy_offset(blob, start, hlen)
    stream = io.BytesIO(blob.read(0, start + hlen))
    stream.seek(8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy warns about odd but readable headers
            private = getattr(getattr(numpy.lib, "_format_impl", None), "_read_array_header", None)
            if private is not None:  # np.load's own reader: every version, minor version checked
                _, _, dtype = private(stream, (major, minor), max_header_size=1 << 21)
            else:
                read = npformat.read_array_header_1_0 if major == 1 else npformat.read_array_header_2_0
                _, _, dtype = read(stream, max_header_size=1 << 21)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError) as exc:
        raise InputError(f"bad .npy header (np.load refuses it): {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(dtype, numpy.dtype):
        raise InputError("bad .npy header: no dtype")
    return start + hlen if dtype.hasobject else None
