"""Pickle opcodes for ints and int tuples, as torch.save's pickler writes them (shared by the torch writers)."""
from __future__ import annotations

import functools
import pickle
import struct

_P = pickle
_pack_H = struct.Struct("<H").pack
_pack_i = struct.Struct("<i").pack


def _int(value: int) -> bytes:
    if 0 <= value < 256:
        return _P.BININT1 + bytes((value,))
    if 0 <= value < 65536:
        return _P.BININT2 + _pack_H(value)
    if -(2 ** 31) <= value < 2 ** 31:
        return _P.BININT + _pack_i(value)
    encoded = pickle.encode_long(value)
    return _P.LONG1 + bytes((len(encoded),)) + encoded


@functools.lru_cache(maxsize=4096)
def _int_tuple(values: tuple[int, ...]) -> bytes:
    n = len(values)
    if n == 0:
        return _P.EMPTY_TUPLE
    body = b"".join(_int(v) for v in values)
    if n <= 3:
        return body + (_P.TUPLE1, _P.TUPLE2, _P.TUPLE3)[n - 1]
    return _P.MARK + body + _P.TUPLE
