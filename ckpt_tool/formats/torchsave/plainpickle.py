"""Plain pickle and dill files, read with the restricted unpickler.

What people pickle: dicts (or nested dicts/lists) of torch tensors or NumPy
arrays, and whole nn.Modules (dill handles lambdas and ``__main__`` classes
by value). A pickle holds its data inline, so the whole file is read; nothing
in it is imported or called: dill's functions, code objects and by-value
classes become inert placeholders, and torch tensors (``_load_from_bytes``)
are parsed by ckpt's own torch.save readers.
"""
from __future__ import annotations

import io
import os

from ...errors import InputError
from ...format_names import Format
from ...io import read_pickle_file
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import restricted_load_stream
from ..interface import FormatReader, Loaded, ReadOptions

DILL_MODULES = ("dill._dill", "dill.dill", "dill")


def read_pickle(path: str, options: ReadOptions) -> Loaded:
    """A pickle or dill file as a container tree (format "dill" when dill's globals appear)."""
    data = read_pickle_file(path, options.limits.max_pickle_bytes, "pickle file")
    size = len(data)
    stream = io.BytesIO(data)
    seen: set[int] = set()
    where = os.path.basename(path) or "pickle"
    result = restricted_load_stream(stream, where=where, path=path,
                                    limits=options.limits, read_blob=options.read_blob, opcodes=seen)
    warnings: list[str] = []
    rest = size - stream.tell()
    if rest > 0 and type(result.obj) is int:
        # An integer, then more pickles: the legacy torch.save layout with a magic number that is not torch's.
        raise InputError(f"a pickled integer ({result.obj:#x}) followed by {rest} more bytes: the layout of a legacy "
                         "torch.save file, but not its magic number (torch.load refuses it: 'Invalid magic number')",
                         path)
    if rest > 0:
        warnings.append(f"{rest} bytes after the end of the pickle were not read (a second pickle?)")
    is_dill = any(ref.module in DILL_MODULES for ref in result.references)
    return Loaded(Format.DILL if is_dill else Format.PICKLE, result.obj, tuple(result.references), tuple(warnings),
                  weights_only=wo_input.read(wo_input.PICKLE, path, [(result.data, seen, result.references, where)]))


READER = FormatReader(Format.PICKLE, read_pickle, unsafe_load=True)
