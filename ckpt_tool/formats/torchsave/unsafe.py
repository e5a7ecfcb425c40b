"""``--unsafe``: let torch (or dill) unpickle a trusted file for real.

Only ever used when the user passes --unsafe; nothing falls back to it. The
result is the real object tree (tensors, modules, NumPy arrays), which locate
handles like the restricted readers' placeholders.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

from ... import dtypes
from ...errors import InputError
from ...format_names import Format
from ...pickles.unpickle.placeholders import NumpyArray
from ..checkpoint.loaded import Loaded, ReadOptions

_MAX_DEPTH = 64


def read_unsafe(path: str, fmt: Format, options: ReadOptions) -> Loaded:
    """Load with torch.load(weights_only=False) or dill, mapping every storage to the CPU."""
    import torch

    from .live import remember_locations

    note = "loaded with --unsafe: the file's pickles were executed (use only for files you trust)"
    if fmt == Format.PICKLE:
        obj, fmt = _load_pickle(path)
    elif _is_torchscript(path, fmt):
        try:
            module = torch.jit.load(path, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - trusted load: any failure of the file's code is a load error
            raise InputError(f"torch.jit.load failed: {_one_line(exc)}", path) from exc
        loaded = Loaded(Format.TORCHSCRIPT, OrderedDict(module.state_dict()), warnings=[note], layout="torchscript")
        return loaded
    else:
        locations: dict[int, str] = {}

        def to_cpu(storage: Any, location: str) -> Any:
            locations[storage.data_ptr()] = str(location)
            return storage

        try:
            obj = torch.load(path, map_location=to_cpu, weights_only=False)
        except Exception as exc:  # noqa: BLE001 - trusted load: any failure of the file's code is a load error
            raise InputError(f"torch.load failed: {_one_line(exc)}", path) from exc
        remember_locations(locations)
    return Loaded(fmt, _numpy_arrays(obj, 0), warnings=[note])


def _load_pickle(path: str) -> tuple[Any, Format]:
    from ...pickles.scanner import scan_pickle_bytes

    with open(path, "rb") as f:
        head = f.read()
    uses_dill = any(g.module.startswith("dill") for g in scan_pickle_bytes(head, where="pickle").globals)
    try:
        import dill as loader  # dill reads plain pickles too
    except ImportError:
        if uses_dill:
            raise InputError("this is a dill pickle and dill is not installed (pip install dill)", path) from None
        import pickle as loader  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            obj = loader.load(f)
    except Exception as exc:  # noqa: BLE001 - trusted load: any failure of the file's code is a load error
        raise InputError(f"unpickling failed: {_one_line(exc)}", path) from exc
    return obj, Format.DILL if uses_dill else Format.PICKLE


def _is_torchscript(path: str, fmt: Format) -> bool:
    if fmt == Format.TORCH_TAR:
        return False
    from ...io.zip.archive import ZipArchive

    try:
        archive = ZipArchive(path)
    except InputError:
        return False
    try:
        names = archive.names()
    finally:
        archive.close()
    prefix = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
    return f"{prefix}constants.pkl" in archive.members or any(n.startswith(f"{prefix}code/") for n in names)


def _numpy_arrays(obj: Any, depth: int) -> Any:
    """Real NumPy arrays in containers become NumpyArray records, as the safe reader makes them."""
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
            obj[k] = _numpy_arrays(obj[k], depth + 1)
        return obj
    if isinstance(obj, list):
        obj[:] = [_numpy_arrays(v, depth + 1) for v in obj]
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_numpy_arrays(v, depth + 1) for v in obj)
    return obj


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
