"""One cheap pass over a pickle's opcodes before CPython's C unpickler sees it.

The C unpickler trusts two kinds of numbers in the bytes: a memo index
(``LONG_BINPUT 0x10000000`` makes it grow its memo array to 2 x the index and
zero it: 4 GiB written for a 6-byte pickle) and the length of counted data
(``BINBYTES8``/``BYTEARRAY8`` allocate the claimed length before reading).
This pass walks every opcode and refuses a memo index larger than the pickle
could legitimately fill, and a length that runs past the end of the bytes,
so what the C unpickler allocates stays in proportion to the pickle's size.

Runs of fixed-size opcodes (and short counted strings) are matched by one
regular expression, so the walk runs at C speed: about 0.3 s for the 21 MB
``data.pkl`` of a 200,000-tensor torch file (unpickling it takes ~1 s).

Given a ``seen`` set, the walk also records, at no cost for a torch.save
pickle, every opcode outside ``QUIET`` (the opcodes such a pickle is made
of): the weights_only predictor (wo_input.py) learns from it whether torch's
weights_only unpickler would meet an opcode it refuses, a list or a NEWOBJ.
"""
from __future__ import annotations

import functools
import io
import re
import struct
from collections.abc import Callable
from typing import Any

from ...errors import InputError

# Opcodes without an argument (STOP is handled separately: it ends the walk).
_NOARG = b"()012NRbdaeltsu}])Qo\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94\x97\x98"
_FIXED = {  # opcode -> argument bytes
    **{c: 1 for c in b"Khq\x80\x82"}, **{c: 2 for c in b"M\x83"}, **{c: 4 for c in b"Jj\x84"}, ord("G"): 8,
}
_COUNT1 = frozenset(b"\x8cCU\x8a")  # SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING, LONG1
_COUNT4 = frozenset(b"XBT\x8b")  # BINUNICODE, BINBYTES, BINSTRING, LONG4 (T and LONG4 are signed)
_COUNT8 = frozenset(b"\x8d\x8e\x96")  # BINUNICODE8, BINBYTES8, BYTEARRAY8
_LINE1 = frozenset(b"ILFSVgpP")  # INT, LONG, FLOAT, STRING, UNICODE, GET, PUT, PERSID: one text line
_LINE2 = frozenset(b"ci")  # GLOBAL, INST: two text lines
_STOP = ord(".")
_LONG_BINPUT = ord("r")
_PUT = ord("p")
_FRAME = 0x95
_ENUMERATED = 64  # counted strings up to this length are matched by the regular expression
_MIN_MEMO_BITS = 16  # memo indices below 65,536 are always accepted (a 1 MiB memo at most)
# What a protocol-2 torch.save pickle is made of, less EMPTY_LIST and NEWOBJ: with ``seen``, every other opcode
# leaves the regular-expression run, so walk() records it (until one torch refuses is seen).
QUIET = frozenset(b"()NRtu}Q\x85\x86\x87\x88\x89baes\x8frqhK\x80XMJjGU\x8ac.")
_SEEN_ALWAYS = frozenset(b"]\x81")  # recorded, but accepted by torch's weights_only unpickler
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


class NeedMore(Exception):
    """The bytes given so far end inside an opcode (streams read more and retry)."""


@functools.cache
def _run_pattern(memo_bits: int, quiet: bool = False) -> Callable[..., Any]:
    """A regex matching a maximal run of opcodes that need no check beyond their syntax.

    LONG_BINPUT is in the run only with an index below 2**memo_bits; counted
    strings only up to _ENUMERATED bytes (each length is one alternative).
    ``quiet``: only opcodes in QUIET are in the run.
    """
    any1 = rb"[\x00-\xff]"

    def one(c: int) -> bytes:
        return re.escape(bytes([c]))

    def counted(prefix: bytes, width: int) -> bytes:
        pad = b"\x00" * (width - 1)
        alts = [one(n) + pad + (any1 + b"{%d}" % n if n else b"") for n in range(_ENUMERATED)]
        return prefix + b"(?:" + b"|".join(alts) + b")"

    if memo_bits <= 16:
        binput = b"r" + any1 + b"{2}\x00\x00"
    elif memo_bits <= 24:
        binput = b"r" + any1 + b"{2}[\\x00-" + one((1 << (memo_bits - 16)) - 1) + b"]\x00"
    else:
        binput = b"r" + any1 + b"{3}[\\x00-" + one((1 << (min(memo_bits, 32) - 24)) - 1) + b"]"
    def ops(codes: bytes) -> bytes:
        return b"[" + b"".join(one(c) for c in codes if not quiet or c in QUIET) + b"]"

    parts = [  # most frequent first: torch's data.pkl is mostly these
        binput,
        ops(b"Khq\x80\x82") + any1,
        ops(_NOARG),
        counted(b"X", 4),
        ops(b"M\x83") + any1 + b"{2}",
        ops(b"Jj\x84") + any1 + b"{4}",
        b"G" + any1 + b"{8}",
        counted(ops(b"\x8cCU\x8a"), 1),
    ]
    return re.compile(b"(?:" + b"|".join(parts) + b")*+").match


def memo_bits(size: int) -> int:
    """Bits allowed in a memo index for a pickle of ``size`` bytes (each PUT costs at least 2 bytes)."""
    return max(_MIN_MEMO_BITS, (max(size, 1) - 1).bit_length())


def walk(data: Any, pos: int, end: int, *, total: int, where: str, path: str, seen: set[int] | None = None) -> int:
    """Check opcodes from ``pos``; return the offset just past STOP.

    ``data[:end]`` holds the bytes read so far; ``total`` is how many the
    pickle can have at most (the rest of the file). Raises NeedMore when an
    opcode continues past ``end`` but within ``total``, InputError when it
    runs past ``total`` or a number in it is out of proportion. An unknown
    opcode ends the walk early: the unpickler reports it. ``seen`` collects
    opcodes outside QUIET (see the module docstring).
    """
    bits = memo_bits(total)
    limit = 1 << bits
    recording = seen is not None and seen <= _SEEN_ALWAYS
    run = _run_pattern(bits, recording)

    def need(upto: int) -> None:
        if upto > total:
            raise InputError(f"{where} is not a readable pickle: the pickle is truncated", path)
        if upto > end:
            raise NeedMore

    while True:
        m = run(data, pos, end)
        pos = m.end()
        need(pos + 1)
        op = data[pos]
        if op == _STOP:
            return pos + 1
        if recording and op not in QUIET:
            seen.add(op)  # type: ignore[union-attr]
            if not seen <= _SEEN_ALWAYS:  # type: ignore[operator]
                recording = False  # torch refuses this pickle: the rest needs no recording
                run = _run_pattern(bits)
        pos = _past(data, pos, op, need, limit, where, path, end, total)
        if pos < 0:
            return -pos  # unknown opcode: the unpickler stops here with its own error


def _past(data: Any, pos: int, op: int, need: Callable[[int], None], limit: int, where: str, path: str,
          end: int, total: int) -> int:
    """The offset just past the opcode ``op`` at ``pos``, its argument checked; minus pos + 1 for an unknown one."""
    n = _FIXED.get(op)
    if n is not None or op in _NOARG:  # an opcode cut off at the end of the bytes read
        need(pos + 1 + (n or 0))
        return pos + 1 + (n or 0)
    if op == _LONG_BINPUT:
        need(pos + 5)
        (index,) = _U32.unpack_from(data, pos + 1)
        _check_memo(index, limit, where, path)
        return pos + 5
    if op in _COUNT1:
        need(pos + 2)
        after: int = pos + 2 + data[pos + 1]
        need(after)
        return after
    if op in _COUNT4:
        need(pos + 5)
        (length,) = (_I32 if op in b"T\x8b" else _U32).unpack_from(data, pos + 1)
        if length < 0:
            raise InputError(f"{where} is not a readable pickle: negative length at byte {pos}", path)
        after = pos + 5 + length
        need(after)
        return after
    if op in _COUNT8 or op == _FRAME:
        need(pos + 9)
        (length,) = _U64.unpack_from(data, pos + 1)
        need(pos + 9 + length)  # a frame's bytes are opcodes too: only its length is checked
        return pos + 9 if op == _FRAME else pos + 9 + length
    if op in _LINE1 or op in _LINE2:
        nl = pos
        for _ in range(2 if op in _LINE2 else 1):
            nl = _find_newline(data, nl + 1, end, total, where, path)
        if op == _PUT:
            _check_memo(_put_index(bytes(data[pos + 1:nl])), limit, where, path)
        return nl + 1
    return -(pos + 1)


def _find_newline(data: Any, start: int, end: int, total: int, where: str, path: str) -> int:
    nl = data.find(b"\n", start, end) if hasattr(data, "find") else bytes(data[start:end]).find(b"\n")
    if nl < 0:
        if end >= total:
            raise InputError(f"{where} is not a readable pickle: the pickle is truncated", path)
        raise NeedMore
    return nl if hasattr(data, "find") else start + nl


def _put_index(text: bytes) -> int:
    """PUT's decimal index as the unpickler parses it (signs, spaces, underscores); -1 if it cannot."""
    if len(text) > 64:
        return 1 << 64  # far too many digits for any real memo
    try:
        return int(text)
    except ValueError:
        return -1  # the unpickler refuses it with its own error


def _check_memo(index: int, limit: int, where: str, path: str) -> None:
    if index >= limit:
        raise InputError(
            f"{where} is not a readable pickle: memo index {index} is far beyond what a pickle of this size "
            "can fill (a corrupt or hostile file)", path,
        )


def check_bytes(data: bytes, *, where: str, path: str, seen: set[int] | None = None) -> int:
    """Walk a pickle held in memory; returns the offset just past its STOP."""
    try:
        return walk(data, 0, len(data), total=len(data), where=where, path=path, seen=seen)
    except NeedMore:  # cannot happen when end == total; kept for the type checker's sake
        raise InputError(f"{where} is not a readable pickle: the pickle is truncated", path) from None


def read_one(stream: Any, *, where: str, path: str, max_bytes: int, seen: set[int] | None = None) -> bytes:
    """The bytes of exactly one pickle from ``stream``, checked; the stream is left just past them.

    Reads in growing chunks, never more than the pickle needs (plus one
    chunk), and never past ``max_bytes`` or the end of the stream.
    """
    start = stream.tell()
    end_of_stream = stream.seek(0, io.SEEK_END)
    stream.seek(start)
    total = min(max(end_of_stream - start, 0), max_bytes)
    buf = bytearray()
    chunk = 1 << 16
    pos = 0
    while True:
        want = min(chunk, total - len(buf))
        if want > 0:
            got = stream.read(want)
            buf += got
            if len(got) < want:
                total = len(buf)  # the stream ended earlier than it said
        try:
            stop = walk(buf, pos, len(buf), total=total, where=where, path=path, seen=seen)
        except NeedMore:
            chunk = min(chunk * 2, 1 << 24)
            continue
        except InputError as exc:
            if "truncated" in exc.message:
                stream.seek(0, io.SEEK_END)  # so callers see the whole stream consumed, as the unpickler would
            raise
        stream.seek(start + stop)
        return bytes(buf[:stop])
