"""A symbolic walk over one pickle's opcodes: what it would import and call, never running it.

pickletools only lists opcodes; to know which global a ``STACK_GLOBAL``
names, the walk keeps the unpickler's stack, mark stack and memo with
symbolic values (constants, globals, "something built at load time"). So a
module name fetched from the memo, pushed long before, or hidden inside a
tuple is still resolved; a name computed at load time cannot be, and is
reported as an unresolvable (dangerous) global. Calls of known loaders
(``pickle.loads``, ``torch.storage._load_from_bytes``, ...) on constant bytes
hand those bytes to the caller, which scans them as a nested pickle.

It follows CPython's unpickler opcode by opcode (mark checks, memo errors,
line-based arguments) so that where the real unpickler would stop, the walk
stops too, and where it would go on, the walk does not give up early.
"""
from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Union

from ..model import GlobalRef
from . import severity as levels

SMALL = 1 << 16  # bytes/str arguments above this are referenced by offset, not held
MAX_LINE = 1 << 20  # longest text line a protocol-0 opcode may carry


class _Unknown:
    """A value the walk cannot know: a list, a dict, a persistent id, ..."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Glob:
    module: str
    name: str


@dataclass(frozen=True)
class Made:
    """An object the pickle builds at load time by calling ``by``."""

    by: object


@dataclass(frozen=True)
class BytesRef:
    """A large bytes argument, left in the stream: (offset, length) in the walked stream."""

    offset: int
    length: int


@dataclass(frozen=True)
class BigStr:
    length: int


@dataclass(frozen=True)
class Stream:
    """``io.BytesIO(payload)``, so ``pickle.load(io.BytesIO(b))`` is recognised as nested."""

    payload: object


@dataclass(frozen=True)
class Finding:
    """Something the pickle does that is dangerous or suspicious besides naming a global."""

    severity: str
    message: str
    where: str = ""


Payload = Union[bytes, BytesRef]
OnEmbedded = Callable[[Payload, str], None]


@dataclass
class Walk:
    where: str
    globals: list[GlobalRef] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    end: int | None = None  # stream offset just past STOP
    opcodes: int = 0
    plausible: bool = False  # starts with PROTO, or reaches an importable-looking global
    reached: bool = False  # names an importable-looking (or unresolvable) global: it is a pickle
    protocol: int = 0

    @property
    def complete(self) -> bool:
        return self.error is None and self.end is not None


# Functions that unpickle (or unmarshal) their argument: a call with constant
# bytes is followed into those bytes; with computed bytes it is dangerous.
NESTED_LOADERS = frozenset(
    [
        ("pickle", "loads"), ("pickle", "load"), ("pickle", "_loads"), ("pickle", "_load"),
        ("_pickle", "loads"), ("_pickle", "load"), ("cPickle", "loads"), ("cPickle", "load"),
        ("dill", "loads"), ("dill", "load"), ("dill._dill", "loads"), ("dill._dill", "load"),
        ("cloudpickle", "loads"), ("cloudpickle", "load"), ("joblib", "load"),
        ("torch.storage", "_load_from_bytes"), ("torch", "load"), ("torch.serialization", "load"),
        ("numpy", "loads"), ("numpy", "load"), ("pandas", "read_pickle"),
    ]
)
_BYTES_IO = frozenset([("io", "BytesIO"), ("_io", "BytesIO")])
_LATIN1 = frozenset(["latin1", "latin-1", "iso-8859-1", "iso8859-1", "l1"])
_DILL = ("dill._dill", "dill.dill", "dill")
# dill's own idiom for closures: getattr(dill._dill, "_setattr", setattr)(cell, "cell_contents", v).
# In a dill pickle these globals are downgraded to suspicious when every use of them is that idiom.
_GETATTR = frozenset([("builtins", "getattr"), ("__builtin__", "getattr")])
_SETATTR = frozenset([("builtins", "setattr"), ("__builtin__", "setattr"), ("dill._dill", "_setattr"),
                      ("dill.dill", "_setattr")])
_DILL_MODULE = frozenset([("dill", "_dill"), ("dill", "dill")])
_IDIOM = _GETATTR | _SETATTR | _DILL_MODULE


def _is_identifier_path(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


class _Stop(Exception):
    """The real unpickler would raise here; the walk ends with this message."""


def walk(
    f: BinaryIO,
    where: str,
    *,
    size: int,
    on_embedded: OnEmbedded | None = None,
    severity: Callable[[str, str], str] = levels.severity,
) -> Walk:
    """Walk the pickle that starts at ``f``'s position; ``size`` is where the stream ends."""
    w = Walk(where)
    stack: list[object] = []
    metastack: list[list[object]] = []
    memo: dict[int, object] = {}
    seen: set[tuple[str, str]] = set()
    misused: set[tuple[str, str]] = set()  # idiom globals used some other way
    watching = [False]  # an idiom global has been named: track where it flows

    def escape(value: object, depth: int = 0) -> None:
        """Mark idiom globals that flow anywhere but their idiomatic place."""
        if not watching[0]:
            return
        if isinstance(value, Glob):
            if (value.module, value.name) in _IDIOM:
                misused.add((value.module, value.name))
        elif isinstance(value, (tuple, list)) and depth < 8:
            for v in value:
                escape(v, depth + 1)

    def add_global(module: str, name: str, sev: str | None = None) -> Glob:
        key = (module, name)
        if key not in seen:
            seen.add(key)
            if key in _IDIOM:
                watching[0] = True
            w.globals.append(GlobalRef(module, name, sev or severity(module, name), where))
        if module == "?" or (_is_identifier_path(module) and _is_identifier_path(name)):
            w.plausible = w.reached = True
        return Glob(module, name)

    def finding(sev: str, message: str) -> None:
        w.findings.append(Finding(sev, message, where))

    def pop() -> object:
        if not stack:
            raise _Stop("stack underflow")
        return stack.pop()

    def pop_mark() -> list[object]:
        nonlocal stack
        if not metastack:
            raise _Stop("MARK expected but not found")
        items = stack
        stack = metastack.pop()
        return items

    def top() -> object:
        if not stack:
            raise _Stop("stack underflow")
        return stack[-1]

    def readline() -> bytes:
        line = f.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise _Stop("truncated line argument" if len(line) < MAX_LINE else "line argument too long")
        return line[:-1]

    def read_exact(n: int) -> bytes:
        data = f.read(n)
        if len(data) != n:
            raise _Stop("pickle data was truncated")
        return data

    def read_blob(n: int, text: bool) -> object:
        start = f.tell()
        if n < 0 or start + n > size:
            raise _Stop("pickle data was truncated")
        if n <= SMALL:
            raw = read_exact(n)
            return raw.decode("utf-8", "surrogatepass") if text else raw
        f.seek(n, 1)
        return BigStr(n) if text else BytesRef(start, n)

    def as_bytes(value: object) -> Payload | None:
        if isinstance(value, Stream):
            value = value.payload
        if isinstance(value, (bytes, BytesRef)):
            return value
        if isinstance(value, str):
            return value.encode("latin-1", "replace")
        return None

    def call(func: object, args: object, how: str) -> object:
        """Model ``func(*args)``: evaluate what is knowable, report what is not."""
        if isinstance(func, Glob):
            key = (func.module, func.name)
            argv = args if isinstance(args, tuple) else ()
            if key in _GETATTR and how == "call" and _dill_getattr(argv):
                return Glob("builtins", "setattr")
            if key in _SETATTR and how == "call" and len(argv) == 3 and isinstance(argv[1], str):
                if isinstance(argv[0], Glob):
                    finding(levels.DANGEROUS, f"setattr modifies the imported object "
                            f"{argv[0].module}.{argv[0].name} (module-level state)")
                    misused.add(key)
                escape(argv[2])
                return Made(func)
            if key in _IDIOM:
                misused.add(key)
            escape(args)
            if key in NESTED_LOADERS:
                payload = as_bytes(argv[0]) if argv else None
                if payload is None:
                    finding(levels.DANGEROUS,
                            f"{func.module}.{func.name} unpickles bytes computed at load time (cannot be checked)")
                elif on_embedded is not None:
                    on_embedded(payload, f"{func.module}.{func.name}")
                return Made(func)
            if key in _BYTES_IO and argv:
                return Stream(argv[0])
            if key == ("_codecs", "encode") and argv and isinstance(argv[0], str):
                enc = argv[1] if len(argv) > 1 and isinstance(argv[1], str) else "utf-8"
                return argv[0].encode("latin-1" if enc.lower() in _LATIN1 else "utf-8", "surrogatepass")
            if func.module in ("builtins", "__builtin__") and func.name in ("bytes", "bytearray") and argv:
                if isinstance(argv[0], (bytes, BytesRef)):
                    return argv[0]
                if isinstance(argv[0], str):
                    return argv[0].encode("latin-1", "replace")
            if func.module in ("builtins", "__builtin__") and func.name == "str" and argv:
                if isinstance(argv[0], str):
                    return argv[0]
                if isinstance(argv[0], bytes) and len(argv) > 1:
                    return argv[0].decode("latin-1")
            if func.module in _DILL and func.name == "_create_type" and argv:
                maker = argv[0]
                if not (isinstance(maker, Glob) or (isinstance(maker, Made) and isinstance(maker.by, Glob)
                                                    and maker.by.name == "_load_type")):
                    finding(levels.DANGEROUS, "dill._create_type calls an object built by the pickle")
            return Made(func)
        escape(args)
        if isinstance(func, Made) or func is UNKNOWN:
            what = f"the result of {func.by.module}.{func.by.name}" if isinstance(func, Made) and isinstance(
                func.by, Glob) else "an object built at load time"
            if how == "call":
                finding(levels.DANGEROUS, f"calls {what} (code the pickle constructed, e.g. a function)")
            else:
                finding(levels.SUSPICIOUS, f"instantiates {what} (a class the pickle constructed)")
            return Made(func)
        raise _Stop(f"{how} of a non-callable constant")

    def mutate(target: object, how: str) -> None:
        if isinstance(target, Glob):
            finding(levels.DANGEROUS,
                    f"{how} modifies the imported object {target.module}.{target.name} (module-level state)")

    read = f.read
    opcodes = 0
    try:
        while True:
            code = read(1)
            if not code:
                raise _Stop("pickle exhausted before STOP")
            opcodes += 1
            c = code[0]
            # ---- the opcodes every torch pickle is made of, first
            if c == 0x71:  # BINPUT
                arg = read(1)
                if not arg or not stack:
                    raise _Stop("pickle data was truncated" if not arg else "stack underflow")
                memo[arg[0]] = stack[-1]
                continue
            if c == 0x68:  # BINGET
                arg = read(1)
                if not arg:
                    raise _Stop("pickle data was truncated")
                if arg[0] not in memo:
                    raise _Stop(f"memo value {arg[0]} not found")
                stack.append(memo[arg[0]])
                continue
            if c == 0x28:  # MARK
                metastack.append(stack)
                stack = []
                continue
            if c == 0x4B:  # BININT1
                arg = read(1)
                if not arg:
                    raise _Stop("pickle data was truncated")
                stack.append(arg[0])
                continue
            if c == 0x8C:  # SHORT_BINUNICODE
                size_byte = read(1)
                if not size_byte:
                    raise _Stop("pickle data was truncated")
                stack.append(read_exact(size_byte[0]).decode("utf-8", "surrogatepass"))
                continue
            if c == 0x74:  # TUPLE
                items = pop_mark()  # rebinds ``stack``: never inline into stack.append(...)
                stack.append(tuple(items))
                continue
            # ---- constants
            if c == 0x80:  # PROTO
                proto = read_exact(1)[0]
                if proto > 5:
                    raise _Stop(f"unsupported pickle protocol {proto}")
                w.protocol = proto
                if opcodes == 1:
                    w.plausible = True
            elif c == 0x95:  # FRAME
                read_exact(8)
            elif c in (0x4B, 0x4D, 0x4A):  # BININT1, BININT2, BININT
                fmt = {0x4B: "<B", 0x4D: "<H", 0x4A: "<i"}[c]
                stack.append(struct.unpack(fmt, read_exact(struct.calcsize(fmt)))[0])
            elif c == 0x8A:  # LONG1
                n = read_exact(1)[0]
                stack.append(int.from_bytes(read_exact(n), "little", signed=True))
            elif c == 0x8B:  # LONG4
                (n,) = struct.unpack("<i", read_exact(4))
                value = read_blob(n, False)
                stack.append(int.from_bytes(value, "little", signed=True) if isinstance(value, bytes) else UNKNOWN)
            elif c == 0x49:  # INT
                line = readline()
                stack.append(False if line == b"00" else True if line == b"01" else _int(line))
            elif c == 0x4C:  # LONG
                line = readline()
                stack.append(_int(line[:-1] if line.endswith(b"L") else line))
            elif c == 0x46:  # FLOAT
                stack.append(_float(readline()))
            elif c == 0x47:  # BINFLOAT
                stack.append(struct.unpack(">d", read_exact(8))[0])
            elif c == 0x4E:  # NONE
                stack.append(None)
            elif c in (0x88, 0x89):
                stack.append(c == 0x88)
            elif c == 0x53:  # STRING
                line = readline()
                if len(line) < 2 or line[:1] != line[-1:] or line[:1] not in (b"'", b'"'):
                    raise _Stop("the STRING opcode argument must be quoted")
                stack.append(codecs.escape_decode(line[1:-1])[0].decode("latin-1"))
            elif c == 0x54:  # BINSTRING
                (n,) = struct.unpack("<i", read_exact(4))
                value = read_blob(n, False)
                stack.append(value.decode("latin-1") if isinstance(value, bytes) else BigStr(n))
            elif c == 0x55:  # SHORT_BINSTRING
                stack.append(read_exact(read_exact(1)[0]).decode("latin-1"))
            elif c == 0x56:  # UNICODE
                stack.append(readline().decode("raw-unicode-escape"))
            elif c == 0x58:  # BINUNICODE
                stack.append(read_blob(struct.unpack("<I", read_exact(4))[0], True))
            elif c == 0x8D:  # BINUNICODE8
                stack.append(read_blob(struct.unpack("<Q", read_exact(8))[0], True))
            elif c == 0x8C:  # SHORT_BINUNICODE
                stack.append(read_exact(read_exact(1)[0]).decode("utf-8", "surrogatepass"))
            elif c == 0x42:  # BINBYTES
                stack.append(read_blob(struct.unpack("<I", read_exact(4))[0], False))
            elif c == 0x43:  # SHORT_BINBYTES
                stack.append(read_exact(read_exact(1)[0]))
            elif c in (0x8E, 0x96):  # BINBYTES8, BYTEARRAY8
                stack.append(read_blob(struct.unpack("<Q", read_exact(8))[0], False))
            elif c == 0x97:  # NEXT_BUFFER
                stack.append(UNKNOWN)
            elif c == 0x98:  # READONLY_BUFFER
                top()
            # ---- containers
            elif c in (0x5D, 0x7D, 0x8F):  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET
                stack.append(UNKNOWN)
            elif c == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif c == 0x61:  # APPEND
                escape(pop())
                mutate(top(), "APPEND")
            elif c in (0x65, 0x75, 0x90):  # APPENDS, SETITEMS, ADDITEMS
                escape(pop_mark())
                mutate(top(), {0x65: "APPENDS", 0x75: "SETITEMS", 0x90: "ADDITEMS"}[c])
            elif c == 0x73:  # SETITEM
                escape((pop(), pop()))
                mutate(top(), "SETITEM")
            elif c in (0x6C, 0x64, 0x91):  # LIST, DICT, FROZENSET
                escape(pop_mark())
                stack.append(UNKNOWN)
            elif c in (0x85, 0x86, 0x87):  # TUPLE1..3
                n = c - 0x84
                if len(stack) < n:
                    raise _Stop("stack underflow")
                packed = tuple(stack[-n:])
                del stack[-n:]
                stack.append(packed)
            # ---- stack and memo
            elif c == 0x30:  # POP
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif c == 0x32:  # DUP
                stack.append(top())
            elif c == 0x31:  # POP_MARK
                pop_mark()
            elif c in (0x67, 0x68, 0x6A):  # GET, BINGET, LONG_BINGET
                idx = _int(readline()) if c == 0x67 else (read_exact(1)[0] if c == 0x68
                                                          else struct.unpack("<I", read_exact(4))[0])
                if idx not in memo:
                    raise _Stop(f"memo value {idx} not found")
                stack.append(memo[idx])
            elif c in (0x70, 0x71, 0x72):  # PUT, BINPUT, LONG_BINPUT
                idx = _int(readline()) if c == 0x70 else (read_exact(1)[0] if c == 0x71
                                                          else struct.unpack("<I", read_exact(4))[0])
                if idx < 0:
                    raise _Stop("negative PUT argument")
                memo[idx] = top()
            elif c == 0x94:  # MEMOIZE
                memo[len(memo)] = top()
            # ---- globals and calls
            elif c in (0x63, 0x69):  # GLOBAL, INST
                if c == 0x69 and not metastack:
                    raise _Stop("INST without a MARK")  # CPython checks the mark before importing
                raw_module, raw_name = readline(), readline()
                try:
                    module = raw_module.decode("utf-8" if c == 0x63 else "ascii")
                    name = raw_name.decode("utf-8" if c == 0x63 else "ascii")
                except UnicodeDecodeError:
                    raise _Stop("global name is not valid text") from None
                g = add_global(module, name)
                if c == 0x63:
                    stack.append(g)
                else:
                    items = pop_mark()
                    stack.append(call(g, tuple(items), "instantiation"))
            elif c == 0x93:  # STACK_GLOBAL
                name_v, module_v = pop(), pop()
                if isinstance(module_v, str) and isinstance(name_v, str):
                    stack.append(add_global(module_v, name_v))
                else:
                    add_global("?", "?", levels.DANGEROUS)
                    finding(levels.DANGEROUS,
                            f"STACK_GLOBAL names a global computed at load time ({_describe(module_v)}."
                            f"{_describe(name_v)}), which cannot be resolved statically")
                    stack.append(UNKNOWN)
            elif c in (0x82, 0x83, 0x84):  # EXT1, EXT2, EXT4
                fmt = {0x82: "<B", 0x83: "<H", 0x84: "<i"}[c]
                (ext,) = struct.unpack(fmt, read_exact(struct.calcsize(fmt)))
                add_global("?", f"<extension code {ext}>", levels.DANGEROUS)
                finding(levels.DANGEROUS,
                        f"extension code {ext} names a global through copyreg's registry at load time")
                stack.append(UNKNOWN)
            elif c == 0x52:  # REDUCE
                args = pop()
                func = pop()
                w.plausible = w.plausible or isinstance(func, Glob)
                stack.append(call(func, args, "call"))
            elif c == 0x81:  # NEWOBJ
                args = pop()
                cls = pop()
                stack.append(call(cls, args, "instantiation"))
            elif c == 0x92:  # NEWOBJ_EX
                pop()
                args = pop()
                cls = pop()
                stack.append(call(cls, args, "instantiation"))
            elif c == 0x6F:  # OBJ
                items = pop_mark()
                if not items:
                    raise _Stop("OBJ without a class")
                stack.append(call(items[0], tuple(items[1:]), "instantiation"))
            elif c == 0x62:  # BUILD
                escape(pop())
                target = top()
                if isinstance(target, Glob):
                    finding(levels.DANGEROUS,
                            f"BUILD sets attributes on the imported object {target.module}.{target.name}")
            elif c == 0x50:  # PERSID
                readline()
                stack.append(UNKNOWN)
            elif c == 0x51:  # BINPERSID
                escape(pop())
                stack.append(UNKNOWN)
            elif c == 0x2E:  # STOP
                escape(pop())
                w.end = f.tell()
                break
            else:
                raise _Stop(f"unknown opcode {code!r}")
    except _Stop as exc:
        w.error = f"{exc} (near offset {f.tell()})"
    except (ValueError, OverflowError, struct.error, UnicodeDecodeError, MemoryError) as exc:
        # A malformed argument: the real unpickler stops here too; what ran before is reported.
        w.error = f"malformed pickle: {exc} (near offset {f.tell()})"
    w.opcodes = opcodes
    if any(g.module in _DILL for g in w.globals):
        w.globals = [
            GlobalRef(g.module, g.name, levels.SUSPICIOUS, g.where)
            if (g.module, g.name) in _IDIOM and (g.module, g.name) not in misused and g.severity == levels.DANGEROUS
            else g
            for g in w.globals
        ]
    return w


def _dill_getattr(argv: tuple[object, ...]) -> bool:
    """``getattr(dill._dill, "_setattr"[, setattr])``: dill's way to reach setattr."""
    if len(argv) not in (2, 3) or argv[1] != "_setattr":
        return False
    mod = argv[0]
    if not (isinstance(mod, Glob) and (mod.module, mod.name) in _DILL_MODULE):
        return False
    return len(argv) == 2 or (isinstance(argv[2], Glob) and (argv[2].module, argv[2].name) in _SETATTR)


def _int(line: bytes) -> int:
    return int(line)


def _float(line: bytes) -> float:
    return float(line)


def _describe(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, Made) and isinstance(value.by, Glob):
        return f"<result of {value.by.module}.{value.by.name}>"
    return "<computed>"
