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
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ... import dtypes
from ...errors import InputError, RuleConflict
from ..base import OutTensor
from ..output import Output, copy_region, write_all
from ..sourcebytes import Region, tensor_data

METADATA_KEY = "__metadata__"


def check_dtypes(tensors: Sequence[OutTensor]) -> None:
    """safetensors has no code for some dtypes: refuse before writing."""
    for t in tensors:
        if dtypes.lookup(t.dtype).safetensors is None:
            raise RuleConflict(f"safetensors cannot store {t.dtype} (tensor {t.key!r}); "
                               "write a .pth, or cast it with a rules file [cast] entry")
        if t.key == METADATA_KEY:
            raise RuleConflict(f"a tensor cannot be named {METADATA_KEY!r} in safetensors; rename it with --rename")


_PLAIN_KEY = re.compile(r'[ -!#-\[\]-~]*')  # printable ASCII without '"' and '\\': JSON as is


def _json_key(key: str) -> str:
    return f'"{key}"' if _PLAIN_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def header_bytes(tensors: Sequence[OutTensor], metadata: Mapping[str, str]) -> bytes:
    """The JSON header, built as text (200,000 entries through json.dumps cost seconds)."""
    parts = []
    if metadata:
        parts.append(f'"{METADATA_KEY}":' + json.dumps(dict(metadata), separators=(",", ":"), ensure_ascii=False))
    offset = 0
    codes = {name: d.safetensors for name, d in dtypes.BY_NAME.items()}
    packed = {name: d for name, d in dtypes.BY_NAME.items() if d.safetensors_per_item != 1}
    shapes: dict[tuple[int, ...], str] = {}
    # one regex test for all keys when every one is plain (the common case), else one per key
    plain = _PLAIN_KEY.fullmatch("".join(t.key for t in tensors)) is not None
    for t in tensors:
        end = offset + t.nbytes
        shape = shapes.get(t.shape) if t.dtype not in packed else None
        if shape is None:
            shape = ",".join(map(str, dtypes.safetensors_shape(packed[t.dtype], t.shape) if t.dtype in packed
                                 else t.shape))
            if t.dtype not in packed:
                shapes[t.shape] = shape
        key = f'"{t.key}"' if plain else _json_key(t.key)
        parts.append(f'{key}:{{"dtype":"{codes[t.dtype]}","shape":[{shape}],"data_offsets":[{offset},{end}]}}')
        offset = end
    raw = ("{" + ",".join(parts) + "}").encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class Follower(Protocol):
    """Something that reads the file while it is written (commands/migrate/verify/early.py)."""

    def started(self) -> None:
        """The header is in the file and the file has its final size: the tensors' places can be read."""

    def reached(self, offset: int) -> None:
        """Every byte before ``offset`` is in the file."""


def write_safetensors(fd: int, tensors: Sequence[OutTensor], metadata: Mapping[str, str],
                      on_bytes: Callable[[int], None] | None = None, follower: Follower | None = None) -> int:
    """Write one safetensors file to ``fd``; returns the bytes written.

    With a ``follower`` the file is given its final size and its header
    first, and the follower is told how far the tensors' bytes have come.
    """
    check_dtypes(tensors)
    head = header_bytes(tensors, metadata)
    if follower is None:
        out = Output(fd)
        out.write(head)
        return write_body(out, tensors, on_bytes)
    os.ftruncate(fd, len(head) + sum(t.nbytes for t in tensors))
    write_all(fd, head)
    follower.started()
    out = Output(fd, on_disk=follower.reached)
    out.pos = len(head)
    return write_body(out, tensors, on_bytes)


def write_body(out: Output, tensors: Sequence[OutTensor], on_bytes: Callable[[int], None] | None = None) -> int:
    """The tensors' bytes back to back at ``out``'s position (large file regions copied in the kernel)."""
    for t, pieces in tensor_data(tensors, regions=True):
        if isinstance(pieces, Region):
            copy_region(out, pieces, on_bytes=on_bytes)
            continue
        written = 0
        for piece in pieces:
            out.write(piece)
            written += len(piece)
        if written != t.nbytes:
            raise InputError(f"tensor {t.source.key!r}: expected {t.nbytes} bytes but the source gave {written}")
        if on_bytes is not None:
            on_bytes(t.nbytes)
    out.flush()
    return out.pos
