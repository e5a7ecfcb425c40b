"""``--unsafe`` loads that torch itself performs: torch.load, torch.jit.load, and the NumPy arrays they return.

formats/torchsave/unsafe.py decides when a trusted load happens; the calls
into torch (and the NumPy types the result may hold) are here, so that the
formats layer never imports either.
"""
from __future__ import annotations

import sys
from collections import OrderedDict

from ... import dtypes
from ...errors import InputError
from ...pickles.unpickle import NumpyArray
from .live import remember_locations

_MAX_DEPTH = 64


def torch_load_trusted(path: str) -> object:
    """torch.load(weights_only=False) with every storage left on the CPU; where each was saved is remembered
    (live.remember_locations), so a tensor saved on ``cuda:1`` is reported as such."""
    import torch

    locations: dict[int, str] = {}

    def to_cpu(storage: torch.types.Storage, location: str) -> torch.types.Storage:
        locations[storage.data_ptr()] = str(location)
        return storage

    try:
        obj: object = torch.load(path, map_location=to_cpu, weights_only=False)
    except Exception as exc:  # trusted load: any failure of the file's code is a load error
        raise InputError(f"torch.load failed: {one_line(exc)}", path) from exc
    remember_locations(locations)
    return obj


def torchscript_state(path: str) -> OrderedDict[str, object]:
    """The state_dict of a TorchScript archive, loaded by torch.jit.load on the CPU."""
    import torch

    try:
        module = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]  # torch leaves it untyped
    except Exception as exc:  # trusted load: any failure of the file's code is a load error
        raise InputError(f"torch.jit.load failed: {one_line(exc)}", path) from exc
    return OrderedDict(module.state_dict())


def numpy_arrays_as_records(obj: object, depth: int = 0) -> object:
    """Real NumPy arrays in containers become NumpyArray records, as the safe reader makes them.

    NumPy is looked up, not imported: a trusted load that returned arrays has imported it.
    """
    np = sys.modules.get("numpy")
    if np is None or depth > _MAX_DEPTH:
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            return obj
        arr = obj.astype(obj.dtype.newbyteorder("<")) if obj.dtype.byteorder == ">" else obj
        code = arr.dtype.str
        dt = dtypes.BY_NUMPY.get(code)
        # tobytes() is C order whatever the array's layout (and keeps 0-d arrays 0-d)
        return NumpyArray(dt, tuple(int(d) for d in arr.shape), False, arr.tobytes(order="C"), code)
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = numpy_arrays_as_records(obj[k], depth + 1)
        return obj
    if isinstance(obj, list):
        obj[:] = [numpy_arrays_as_records(v, depth + 1) for v in obj]
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(numpy_arrays_as_records(v, depth + 1) for v in obj)
    return obj


def one_line(exc: BaseException) -> str:
    """An exception as one short line for an InputError."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
