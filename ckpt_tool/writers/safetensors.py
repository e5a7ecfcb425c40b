"""safetensors files, written with the standard library, one tensor at a time.

Layout as the format defines it: an 8-byte little-endian header length, a
JSON header padded with spaces to a multiple of 8, then the tensors' bytes
back to back with no gaps. Tensors are laid out in the order given (the
source's order, so the source is read front to back); contiguous tensors
are copied chunk by chunk, so memory stays near one chunk, or one tensor for
casts and strided views.

Tied tensors are stored once; each alias is recorded in ``__metadata__`` as
``alias -> stored key``, the convention of ``safetensors.torch.save_model``,
so ``load_model`` (whose model ties the weights itself) and ckpt's reader
(which restores the alias) both get the tie back.
"""
from __future__ import annotations

import json
import struct
from typing import Callable, Mapping, Sequence

from .. import dtypes
from ..errors import RuleConflict
from .base import OutTensor, out_chunks, write_all

METADATA_KEY = "__metadata__"


def check_dtypes(tensors: Sequence[OutTensor]) -> None:
    """safetensors has no code for some dtypes: refuse before writing."""
    for t in tensors:
        if dtypes.lookup(t.dtype).safetensors is None:
            raise RuleConflict(f"safetensors cannot store {t.dtype} (tensor {t.key!r}); "
                               "write a .pth, or cast it with a rules file [cast] entry")
        if t.key == METADATA_KEY:
            raise RuleConflict(f"a tensor cannot be named {METADATA_KEY!r} in safetensors; rename it with --rename")


def header_bytes(tensors: Sequence[OutTensor], metadata: Mapping[str, str]) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for t in tensors:
        header[t.key] = {"dtype": dtypes.lookup(t.dtype).safetensors, "shape": list(t.shape),
                         "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(fd: int, tensors: Sequence[OutTensor], metadata: Mapping[str, str],
                      on_bytes: Callable[[int], None] | None = None) -> int:
    """Write one safetensors file to ``fd``; returns the bytes written."""
    check_dtypes(tensors)
    total = write_all(fd, header_bytes(tensors, metadata))
    for t in tensors:
        written = 0
        for chunk in out_chunks(t):
            total += write_all(fd, chunk)
            written += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        if written != t.nbytes:
            raise RuleConflict(f"tensor {t.key!r}: expected {t.nbytes} bytes but got {written}")
    return total
