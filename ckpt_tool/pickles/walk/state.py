"""The walk's machine state and the opcodes that only move data: constants, containers, stack, memo.

walker.py adds what judges a pickle (globals, calls, objects) and the dispatch table.
"""
from __future__ import annotations

import codecs
import struct
from collections.abc import Callable
from typing import BinaryIO

from ...model import GlobalRef
from .. import severity as levels
from .values import (
    IDIOM,
    MAX_LINE,
    SMALL,
    UNKNOWN,
    BigStr,
    BytesRef,
    Container,
    Finding,
    Glob,
    Made,
    OnEmbedded,
    Walk,
)

TENSOR_MODULES = ("torch._utils", "torch._tensor")
CVE_2026_24747 = ("CVE-2026-24747: SETITEM/SETITEMS applied to a {kind}, not a dict; torch.load(weights_only=True) "
                  "before torch 2.10 corrupts memory on it (code execution)")


_STRUCTS = {fmt: (struct.Struct(fmt).unpack, struct.calcsize(fmt)) for fmt in ("<B", "<H", "<i", "<I", "<Q")}
_U32 = _STRUCTS["<I"][0]


class WalkStop(Exception):
    """The real unpickler would raise here; the walk ends with this message."""


def _is_identifier_path(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


class WalkState:
    """The unpickler's state (stack, mark stack, memo) over symbolic values, and the data opcodes."""

    def __init__(self, f: BinaryIO, where: str, size: int, on_embedded: OnEmbedded | None,
                 severity: Callable[[str, str], str]) -> None:
        self.f = f
        self.read = f.read
        self.size = size
        self.on_embedded = on_embedded
        self.severity = severity
        self.w = Walk(where)
        self.stack: list[object] = []
        self.metastack: list[list[object]] = []
        self.memo: dict[int, object] = {}
        self.seen: set[tuple[str, str]] = set()
        self.misused: set[tuple[str, str]] = set()  # idiom globals used some other way
        self.watching = False  # an idiom global was named: track where it flows
        self.called: set[tuple[str, str]] = set()
        self.vouched: set[tuple[str, str]] = set()  # met where a reviewed pattern vouches (vouch.py)
        self.plain: dict[tuple[str, str], Made] = {}  # callees the walk has nothing more to say about
        self.pid_glob: object = None  # the global the last persistent id named (judged already)
        self.opcodes = 0
        self.done = False

    # -- helpers ------------------------------------------------------------------
    def escape(self, value: object, depth: int = 0) -> None:
        """Mark idiom globals that flow anywhere but their idiomatic place."""
        if not self.watching:
            return
        if isinstance(value, Glob):
            if (value.module, value.name) in IDIOM:
                self.misused.add((value.module, value.name))
        elif isinstance(value, (tuple, list)) and depth < 8:
            for v in value:
                self.escape(v, depth + 1)

    def add_global(self, module: str, name: str, sev: str | None = None) -> Glob:
        key = (module, name)
        if key not in self.seen:
            self.seen.add(key)
            if key in IDIOM:
                self.watching = True
            self.w.globals.append(GlobalRef(module, name, sev or self.severity(module, name), self.w.where))
        if module == "?" or (_is_identifier_path(module) and _is_identifier_path(name)):
            self.w.plausible = self.w.reached = True
        return Glob(module, name)

    def finding(self, sev: str, message: str, glob: str = "") -> None:
        self.w.findings.append(Finding(sev, message, self.w.where, glob))

    def pop(self) -> object:
        if not self.stack:
            raise WalkStop("stack underflow")
        return self.stack.pop()

    def pop_mark(self) -> list[object]:
        if not self.metastack:
            raise WalkStop("MARK expected but not found")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def top(self) -> object:
        if not self.stack:
            raise WalkStop("stack underflow")
        return self.stack[-1]

    def readline(self) -> bytes:
        line = self.f.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise WalkStop("truncated line argument" if len(line) < MAX_LINE else "line argument too long")
        return line[:-1]

    def read_exact(self, n: int) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise WalkStop("pickle data was truncated")
        return data

    def read_blob(self, n: int, text: bool) -> object:
        start = self.f.tell()
        if n < 0 or start + n > self.size:
            raise WalkStop("pickle data was truncated")
        if n <= SMALL:
            raw = self.read_exact(n)
            return raw.decode("utf-8", "surrogatepass") if text else raw
        self.f.seek(n, 1)
        return BigStr(n) if text else BytesRef(start, n)

    def unpack(self, fmt: str) -> int:
        unpack, n = _STRUCTS[fmt]
        data = self.read(n)
        if len(data) != n:
            raise WalkStop("pickle data was truncated")
        return unpack(data)[0]  # type: ignore[no-any-return]

    def mutate(self, target: object, how: str) -> None:
        if isinstance(target, Glob):
            self.finding(levels.DANGEROUS,
                         f"{how} modifies the imported object {target.module}.{target.name} (module-level state)")

    def set_items(self, how: str) -> None:
        target = self.top()
        self.mutate(target, how)
        kind = target.kind if isinstance(target, Container) else (
            type(target).__name__ if isinstance(target, (tuple, str, bytes, int, float, bool)) else None)
        if (isinstance(target, Made) and isinstance(target.by, Glob) and target.by.module in TENSOR_MODULES
                and target.by.name.startswith("_rebuild")):
            kind = "tensor"
        if kind is not None and kind != "dict":
            self.finding(levels.DANGEROUS, CVE_2026_24747.format(kind=kind))

    # -- opcodes: constants ---------------------------------------------------------
    def load_proto(self) -> None:
        proto = self.read_exact(1)[0]
        if proto > 5:
            raise WalkStop(f"unsupported pickle protocol {proto}")
        self.w.protocol = proto
        if self.opcodes == 1:
            self.w.plausible = True

    def load_frame(self) -> None:
        self.read_exact(8)

    def load_binint1(self) -> None:
        data = self.read(1)
        if not data:
            raise WalkStop("pickle data was truncated")
        self.stack.append(data[0])

    def load_binint2(self) -> None:
        self.stack.append(self.unpack("<H"))

    def load_binint(self) -> None:
        self.stack.append(self.unpack("<i"))

    def load_long1(self) -> None:
        n = self.read_exact(1)[0]
        self.stack.append(int.from_bytes(self.read_exact(n), "little", signed=True))

    def load_long4(self) -> None:
        value = self.read_blob(self.unpack("<i"), False)
        self.stack.append(int.from_bytes(value, "little", signed=True) if isinstance(value, bytes) else UNKNOWN)

    def load_int(self) -> None:
        line = self.readline()
        self.stack.append(False if line == b"00" else True if line == b"01" else int(line))

    def load_long(self) -> None:
        line = self.readline()
        self.stack.append(int(line[:-1] if line.endswith(b"L") else line))

    def load_float(self) -> None:
        self.stack.append(float(self.readline()))

    def load_binfloat(self) -> None:
        self.stack.append(struct.unpack(">d", self.read_exact(8))[0])

    def load_none(self) -> None:
        self.stack.append(None)

    def load_true(self) -> None:
        self.stack.append(True)

    def load_false(self) -> None:
        self.stack.append(False)

    def load_string(self) -> None:
        line = self.readline()
        if len(line) < 2 or line[:1] != line[-1:] or line[:1] not in (b"'", b'"'):
            raise WalkStop("the STRING opcode argument must be quoted")
        self.stack.append(codecs.escape_decode(line[1:-1])[0].decode("latin-1"))

    def load_binstring(self) -> None:
        n = self.unpack("<i")
        value = self.read_blob(n, False)
        self.stack.append(value.decode("latin-1") if isinstance(value, bytes) else BigStr(n))

    def load_short_binstring(self) -> None:
        self.stack.append(self.read_exact(self.read_exact(1)[0]).decode("latin-1"))

    def load_unicode(self) -> None:
        self.stack.append(self.readline().decode("raw-unicode-escape"))

    def load_binunicode(self) -> None:  # every key and device name of a torch.save pickle: kept short
        data = self.read(4)
        if len(data) != 4:
            raise WalkStop("pickle data was truncated")
        n = _U32(data)[0]
        if n <= SMALL:
            raw = self.read(n)
            if len(raw) != n:
                raise WalkStop("pickle data was truncated")
            self.stack.append(raw.decode("utf-8", "surrogatepass"))
        else:
            self.stack.append(self.read_blob(n, True))

    def load_binunicode8(self) -> None:
        self.stack.append(self.read_blob(self.unpack("<Q"), True))

    def load_short_binunicode(self) -> None:
        self.stack.append(self.read_exact(self.read_exact(1)[0]).decode("utf-8", "surrogatepass"))

    def load_binbytes(self) -> None:
        self.stack.append(self.read_blob(self.unpack("<I"), False))

    def load_short_binbytes(self) -> None:
        self.stack.append(self.read_exact(self.read_exact(1)[0]))

    def load_binbytes8(self) -> None:  # also BYTEARRAY8
        self.stack.append(self.read_blob(self.unpack("<Q"), False))

    def load_next_buffer(self) -> None:
        self.stack.append(UNKNOWN)

    def load_readonly_buffer(self) -> None:
        self.top()

    # -- opcodes: containers -----------------------------------------------------------
    def load_empty_list(self) -> None:
        self.stack.append(Container("list"))

    def load_empty_dict(self) -> None:
        self.stack.append(Container("dict"))

    def load_empty_set(self) -> None:
        self.stack.append(Container("set"))

    def load_empty_tuple(self) -> None:
        self.stack.append(())

    def load_tuple(self) -> None:
        if not self.metastack:
            raise WalkStop("MARK expected but not found")
        items = self.stack
        self.stack = self.metastack.pop()
        self.stack.append(tuple(items))

    def load_tuple1(self) -> None:
        stack = self.stack
        if not stack:
            raise WalkStop("stack underflow")
        stack[-1] = (stack[-1],)

    def load_tuple2(self) -> None:
        stack = self.stack
        if len(stack) < 2:
            raise WalkStop("stack underflow")
        stack[-2:] = [(stack[-2], stack[-1])]

    def load_tuple3(self) -> None:
        stack = self.stack
        if len(stack) < 3:
            raise WalkStop("stack underflow")
        stack[-3:] = [(stack[-3], stack[-2], stack[-1])]

    def built(self, kind: str) -> None:
        items = self.pop_mark()
        self.escape(items)
        self.stack.append(Container(kind, items))

    def load_list(self) -> None:
        self.built("list")

    def load_dict(self) -> None:
        self.built("dict")

    def load_frozenset(self) -> None:
        self.built("frozenset")

    def put_items(self, items: list[object] | tuple[object, ...], how: str) -> None:
        """APPEND(S), ADDITEMS, SETITEM(S); a container remembers the globals put in it (Container.hold)."""
        self.escape(items)
        target = self.top()
        if target.__class__ is Container:
            target.hold(items)
        if how.startswith("SETITEM"):
            self.set_items(how)
        else:
            self.mutate(target, how)

    def load_append(self) -> None:
        self.put_items((self.pop(),), "APPEND")

    def load_appends(self) -> None:
        self.put_items(self.pop_mark(), "APPENDS")

    def load_additems(self) -> None:
        self.put_items(self.pop_mark(), "ADDITEMS")

    def load_setitem(self) -> None:
        self.put_items((self.pop(), self.pop()), "SETITEM")

    def load_setitems(self) -> None:
        self.put_items(self.pop_mark(), "SETITEMS")

    # -- opcodes: stack and memo ------------------------------------------------------
    def load_mark(self) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def load_pop(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def load_pop_mark(self) -> None:
        self.pop_mark()

    def load_dup(self) -> None:
        self.stack.append(self.top())

    def get(self, idx: int) -> None:
        if idx not in self.memo:
            raise WalkStop(f"memo value {idx} not found")
        self.stack.append(self.memo[idx])

    def put(self, idx: int) -> None:
        if idx < 0:
            raise WalkStop("negative PUT argument")
        self.memo[idx] = self.top()

    def load_get(self) -> None:
        self.get(int(self.readline()))

    def load_binget(self) -> None:
        data = self.read(1)
        if not data:
            raise WalkStop("pickle data was truncated")
        try:
            self.stack.append(self.memo[data[0]])
        except KeyError:
            raise WalkStop(f"memo value {data[0]} not found") from None

    def load_long_binget(self) -> None:
        self.get(self.unpack("<I"))

    def load_put(self) -> None:
        self.put(int(self.readline()))

    def load_binput(self) -> None:
        data = self.read(1)
        if not data or not self.stack:
            raise WalkStop("pickle data was truncated" if not data else "stack underflow")
        self.memo[data[0]] = self.stack[-1]

    def load_long_binput(self) -> None:  # torch.save memoizes every value: the most frequent opcode
        data = self.read(4)
        if len(data) != 4 or not self.stack:
            raise WalkStop("pickle data was truncated" if len(data) != 4 else "stack underflow")
        self.memo[_U32(data)[0]] = self.stack[-1]

    def load_memoize(self) -> None:
        self.memo[len(self.memo)] = self.top()
