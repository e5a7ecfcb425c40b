"""A tiny pickle assembler for the hostile corpus: opcodes spelled out, so each case shows its trick.

Values are encoded by :func:`arg`: ``str`` as BINUNICODE, ``int`` as BININT,
``bytes`` as BINBYTES, ``tuple``/``list``/``dict`` as their opcodes, ``None``,
``True``/``False``, and :class:`Raw` for bytes that are already opcodes (a
nested call). Every builder returns opcodes that leave exactly one item on the
stack; :func:`plain` wraps them as a whole pickle.
"""
from __future__ import annotations

import struct
from typing import Any


class Raw(bytes):
    """Opcodes pushing one value, used as an argument as they are."""


def arg(v: Any) -> bytes:
    if isinstance(v, Raw):
        return bytes(v)
    if v is None:
        return b"N"
    if v is True:
        return b"\x88"
    if v is False:
        return b"\x89"
    if isinstance(v, int):
        return b"J" + struct.pack("<i", v)
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, str):
        raw = v.encode()
        return b"X" + struct.pack("<I", len(raw)) + raw
    if isinstance(v, bytes):
        return b"B" + struct.pack("<I", len(v)) + v
    if isinstance(v, tuple):
        return b"(" + b"".join(arg(x) for x in v) + b"t"
    if isinstance(v, list):
        return b"(" + b"".join(arg(x) for x in v) + b"l"
    if isinstance(v, dict):
        return b"}(" + b"".join(arg(k) + arg(x) for k, x in v.items()) + b"u"
    raise TypeError(type(v))


def glob(module: str, name: str) -> Raw:
    """GLOBAL (text opcode; with a protocol-4 header a dotted name is walked attribute by attribute)."""
    return Raw(f"c{module}\n{name}\n".encode())


def sglob(module: str, name: str) -> Raw:
    """STACK_GLOBAL (dotted names resolve only under a protocol-4 header)."""
    def su(s: str) -> bytes:
        raw = s.encode()
        return b"\x8c" + bytes([len(raw)]) + raw
    return Raw(su(module) + su(name) + b"\x93")


def call(func: bytes, *args: Any) -> Raw:
    """REDUCE: ``func(*args)``; ``func`` is opcodes pushing the callable."""
    return Raw(bytes(func) + arg(tuple(args)) + b"R")


def obj(func: bytes, *args: Any) -> Raw:
    """OBJ: MARK, the class, its args, ``o`` calls class(*args) (any callable works)."""
    return Raw(b"(" + bytes(func) + b"".join(arg(a) for a in args) + b"o")


def inst(module: str, name: str, *args: Any) -> Raw:
    """INST: MARK, args, ``i module\\nname\\n`` imports and calls it."""
    return Raw(b"(" + b"".join(arg(a) for a in args) + f"i{module}\n{name}\n".encode())


def newobj(cls: bytes, *args: Any) -> Raw:
    """NEWOBJ: ``cls.__new__(cls, *args)``."""
    return Raw(bytes(cls) + arg(tuple(args)) + b"\x81")


def newobj_ex(cls: bytes, args: tuple, kwargs: dict) -> Raw:
    """NEWOBJ_EX: ``cls.__new__(cls, *args, **kwargs)``."""
    return Raw(bytes(cls) + arg(args) + arg(kwargs) + b"\x92")


def build(target: bytes, state: Any) -> Raw:
    """BUILD: ``target.__setstate__(state)`` (or a __dict__ update)."""
    return Raw(bytes(target) + arg(state) + b"b")


def plain(body: bytes, proto: int = 2) -> bytes:
    return bytes([0x80, proto]) + bytes(body) + b"."
