"""``--unsafe``: let torch (or dill) unpickle a trusted file for real.

Only ever used when the user passes --unsafe; nothing falls back to it. The
result is the real object tree (tensors, modules, NumPy arrays), which locate
handles like the restricted readers' placeholders.
"""
from __future__ import annotations

from typing import Any

from ...errors import InputError
from ...format_names import Format
from ...tensors.data import numpy_arrays_as_records, one_line, torch_load_trusted, torchscript_state
from ..interface import Loaded, ReadOptions


def read_unsafe(path: str, fmt: Format, options: ReadOptions) -> Loaded:
    """Load with torch.load(weights_only=False) or dill, mapping every storage to the CPU."""
    note = "loaded with --unsafe: the file's pickles were executed (use only for files you trust)"
    if fmt == Format.PICKLE:
        obj, fmt = _load_pickle(path)
    elif _is_torchscript(path, fmt):
        return Loaded(Format.TORCHSCRIPT, torchscript_state(path), warnings=(note,), layout="torchscript")
    else:
        obj = torch_load_trusted(path)
    return Loaded(fmt, numpy_arrays_as_records(obj), warnings=(note,))


def _load_pickle(path: str) -> tuple[Any, Format]:
    from ...pickles import scan_pickle_bytes

    with open(path, "rb") as f:
        head = f.read()
    uses_dill = any(g.module.startswith("dill") for g in scan_pickle_bytes(head, where="pickle").globals)
    try:
        import dill as loader  # dill reads plain pickles too
    except ImportError:
        if uses_dill:
            raise InputError("this is a dill pickle and dill is not installed (pip install dill)", path) from None
        import pickle as loader
    try:
        with open(path, "rb") as f:
            obj = loader.load(f)
    except Exception as exc:  # trusted load: any failure of the file's code is a load error
        raise InputError(f"unpickling failed: {one_line(exc)}", path) from exc
    return obj, Format.DILL if uses_dill else Format.PICKLE


def _is_torchscript(path: str, fmt: Format) -> bool:
    if fmt == Format.TORCH_TAR:
        return False
    from ...io.zip import ZipArchive

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
