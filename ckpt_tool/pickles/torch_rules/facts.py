"""The facts about one pickle that the weights_only predictor needs, by a static symbolic walk.

``facts_from_pickle(bytes)`` runs a ``pickletools`` pass that tracks what
each stack value is (a global, the result of a call, a dict, a list, ...)
without unpickling anything, and records every call, BUILD, SETITEM(S) and
APPEND(S) with the object it acts on (see ``PickleFacts``). It costs about
1.5 microseconds per opcode: wo_input.py runs it only where the cheap facts
the readers record while unpickling cannot decide.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Pair = tuple[str, str]


@dataclass(frozen=True)
class Obj:
    """A value on the unpickler's stack, as far as a static walk can know it."""

    kind: str  # dict list set tuple const global call unknown
    name: Pair | None = None  # kind "global": the global; kind "call": the callee global (None: not a global)
    opcode: str = ""  # kind "call": REDUCE NEWOBJ NEWOBJ_EX OBJ INST
    arg: str | None = None  # kind "call": first positional argument, when a constant str
    arg_global: Pair | None = None  # kind "call": first positional argument, when a global


@dataclass(frozen=True)
class PickleFacts:
    """What predict needs to know about one pickle (see the module docstring)."""

    protocol: int = 2
    opcodes: frozenset[str] = frozenset()
    globals: tuple[Pair, ...] = ()
    calls: tuple[Obj, ...] = ()
    builds: tuple[Obj, ...] = ()
    setitems: tuple[Obj, ...] = ()
    appends: tuple[Obj, ...] = ()
    persistent_ids: tuple[str, ...] = ()
    error: str | None = None


# ---- the symbolic walk
_CONST_OPS = frozenset([
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
    "BINBYTES8", "BYTEARRAY8", "NONE", "NEWTRUE", "NEWFALSE"])
_UNKNOWN = Obj("unknown")
_GETATTR = frozenset([("builtins", "getattr"), ("__builtin__", "getattr")])


def facts_from_pickle(data: bytes) -> PickleFacts:
    """Compute ``PickleFacts`` for one pickle by a symbolic pass over its opcodes (never unpickling)."""
    from pickletools import genops  # a 2 ms import, for the pickles that need this walk

    walk = _SymbolicWalk()
    try:
        for op, arg, _pos in genops(data):
            walk.step(op.name, arg)
    except (ValueError, EOFError) as exc:  # a malformed stream: torch refuses it too
        return PickleFacts(walk.protocol, frozenset(walk.opcodes), tuple(walk.globs), error=str(exc))
    return walk.facts()


def _int(arg: object) -> int:
    """An opcode argument genops decodes as an integer (a bool for protocol 0's "00" and "01")."""
    if isinstance(arg, int):
        return int(arg)
    raise ValueError(f"opcode argument {arg!r} is not an integer")


class _SymbolicWalk:
    """The state of one symbolic pass: what each stack value is, the memo, and what was seen so far."""

    def __init__(self) -> None:
        self.stack: list[object] = []
        self.marks: list[list[object]] = []
        self.memo: dict[int, object] = {}
        self.opcodes: set[str] = set()
        self.globs: dict[Pair, None] = {}
        self.calls: list[Obj] = []
        self.builds: dict[Obj, None] = {}
        self.setitems: dict[Obj, None] = {}
        self.appends: dict[Obj, None] = {}
        self.pids: list[str] = []
        self.protocol = 0

    def step(self, name: str, arg: object) -> None:
        """One opcode: record it, and track what it does to the stack (opcodes without a step change nothing)."""
        self.opcodes.add(name)
        handler = _STEPS.get(name)
        if handler is not None:
            handler(self, name, arg)

    def facts(self) -> PickleFacts:
        return PickleFacts(self.protocol, frozenset(self.opcodes), tuple(self.globs), tuple(self.calls),
                           tuple(self.builds), tuple(self.setitems), tuple(self.appends), tuple(self.pids))

    # -- the stack -----------------------------------------------------------------
    def pop(self) -> object:
        return self.stack.pop() if self.stack else _UNKNOWN

    def top(self) -> object:
        return self.stack[-1] if self.stack else _UNKNOWN

    def pop_mark(self) -> list[object]:
        items, self.stack = self.stack, (self.marks.pop() if self.marks else [])
        return items

    def call(self, func: object, args: object, opcode: str) -> Obj:
        first = args[0] if isinstance(args, tuple) and args else None
        name = func.name if isinstance(func, Obj) and func.kind == "global" else None
        made = Obj("call", name, opcode, first if isinstance(first, str) else None,
                   first.name if isinstance(first, Obj) and first.kind == "global" else None)
        self.calls.append(made)
        return made

    # -- one method per group of opcodes ------------------------------------------
    def proto(self, name: str, arg: object) -> None:
        self.protocol = _int(arg)

    def const(self, name: str, arg: object) -> None:
        self.stack.append(arg)

    def global_(self, name: str, arg: object) -> None:
        """GLOBAL and INST."""
        module, _, gname = str(arg).partition(" ")
        self.globs[(module, gname)] = None
        g = Obj("global", (module, gname))
        made = g if name == "GLOBAL" else self.call(g, tuple(self.pop_mark()), "INST")
        self.stack.append(made)  # after pop_mark, which rebinds ``stack``

    def stack_global(self, name: str, arg: object) -> None:
        gname_v, module_v = self.pop(), self.pop()
        if isinstance(module_v, str) and isinstance(gname_v, str):
            self.globs[(module_v, gname_v)] = None
            self.stack.append(Obj("global", (module_v, gname_v)))
        else:
            self.stack.append(_UNKNOWN)

    def reduce(self, name: str, arg: object) -> None:
        args = self.pop()
        func = self.pop()
        made = self.call(func, args, name)
        if isinstance(func, Obj) and func.name in _GETATTR and isinstance(args, tuple) and len(args) == 2 \
                and isinstance(args[0], Obj) and args[0].kind == "global" and args[0].name is not None \
                and isinstance(args[1], str):
            # protocol 2 names a nested class as getattr(Outer, "Inner"): the value is that global
            made = Obj("global", (args[0].name[0], f"{args[0].name[1]}.{args[1]}"))
        self.stack.append(made)

    def newobj(self, name: str, arg: object) -> None:
        """NEWOBJ and NEWOBJ_EX (whose keyword arguments are dropped)."""
        if name == "NEWOBJ_EX":
            self.pop()
        args = self.pop()
        self.stack.append(self.call(self.pop(), args, name))

    def obj(self, name: str, arg: object) -> None:
        items = self.pop_mark()
        self.stack.append(self.call(items[0] if items else _UNKNOWN, tuple(items[1:]), name))

    def build(self, name: str, arg: object) -> None:
        self.pop()
        self.builds[_as_obj(self.top())] = None

    def setitem(self, name: str, arg: object) -> None:
        if name == "SETITEM":
            self.pop(), self.pop()
        else:
            self.pop_mark()
        self.setitems[_as_obj(self.top())] = None

    def append(self, name: str, arg: object) -> None:
        if name == "APPEND":
            self.pop()
        else:
            self.pop_mark()
        self.appends[_as_obj(self.top())] = None

    def container(self, name: str, arg: object) -> None:
        if name in ("DICT", "LIST", "FROZENSET"):
            self.pop_mark()
        self.stack.append(Obj(_CONTAINERS.get(name, "set")))

    def empty_tuple(self, name: str, arg: object) -> None:
        self.stack.append(())

    def tuple_(self, name: str, arg: object) -> None:
        items = self.pop_mark()  # first: it rebinds ``stack``
        self.stack.append(tuple(items))

    def tuple_n(self, name: str, arg: object) -> None:
        """TUPLE1, TUPLE2 and TUPLE3."""
        n = int(name[-1])
        items = [self.pop() for _ in range(n)][::-1]
        self.stack.append(tuple(items))

    def mark(self, name: str, arg: object) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def pop_op(self, name: str, arg: object) -> None:
        self.pop()

    def pop_mark_op(self, name: str, arg: object) -> None:
        self.pop_mark()

    def dup(self, name: str, arg: object) -> None:
        self.stack.append(self.top())

    def put(self, name: str, arg: object) -> None:
        self.memo[_int(arg)] = self.top()

    def memoize(self, name: str, arg: object) -> None:
        self.memo[len(self.memo)] = self.top()

    def get(self, name: str, arg: object) -> None:
        self.stack.append(self.memo.get(_int(arg), _UNKNOWN))

    def persid(self, name: str, arg: object) -> None:
        pid = self.pop() if name == "BINPERSID" else arg
        head = pid[0] if isinstance(pid, tuple) and pid else None
        head = head.decode("ascii", "replace") if isinstance(head, bytes) else head
        self.pids.append(head if isinstance(head, str) else "?")
        self.stack.append(_UNKNOWN)

    def unknown(self, name: str, arg: object) -> None:
        """EXT1, EXT2, EXT4 (the extension registry) and NEXT_BUFFER: a value the walk cannot know."""
        self.stack.append(_UNKNOWN)


def _as_obj(value: object) -> Obj:
    return value if isinstance(value, Obj) else Obj("tuple") if isinstance(value, tuple) else Obj("const")


_CONTAINERS = {"EMPTY_DICT": "dict", "DICT": "dict", "EMPTY_LIST": "list", "LIST": "list"}  # the rest: "set"
_Step = Callable[[_SymbolicWalk, str, object], None]
_STEPS: dict[str, _Step] = {
    "PROTO": _SymbolicWalk.proto,
    **dict.fromkeys(_CONST_OPS, _SymbolicWalk.const),
    "GLOBAL": _SymbolicWalk.global_, "INST": _SymbolicWalk.global_,
    "STACK_GLOBAL": _SymbolicWalk.stack_global,
    "REDUCE": _SymbolicWalk.reduce,
    "NEWOBJ": _SymbolicWalk.newobj, "NEWOBJ_EX": _SymbolicWalk.newobj,
    "OBJ": _SymbolicWalk.obj,
    "BUILD": _SymbolicWalk.build,
    "SETITEM": _SymbolicWalk.setitem, "SETITEMS": _SymbolicWalk.setitem,
    **dict.fromkeys(("APPEND", "APPENDS", "ADDITEMS"), _SymbolicWalk.append),
    **dict.fromkeys(("EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "DICT", "LIST", "FROZENSET"), _SymbolicWalk.container),
    "EMPTY_TUPLE": _SymbolicWalk.empty_tuple,
    "TUPLE": _SymbolicWalk.tuple_,
    **dict.fromkeys(("TUPLE1", "TUPLE2", "TUPLE3"), _SymbolicWalk.tuple_n),
    "MARK": _SymbolicWalk.mark,
    "POP": _SymbolicWalk.pop_op,
    "POP_MARK": _SymbolicWalk.pop_mark_op,
    "DUP": _SymbolicWalk.dup,
    **dict.fromkeys(("PUT", "BINPUT", "LONG_BINPUT"), _SymbolicWalk.put),
    "MEMOIZE": _SymbolicWalk.memoize,
    **dict.fromkeys(("GET", "BINGET", "LONG_BINGET"), _SymbolicWalk.get),
    **dict.fromkeys(("BINPERSID", "PERSID"), _SymbolicWalk.persid),
    **dict.fromkeys(("EXT1", "EXT2", "EXT4", "NEXT_BUFFER"), _SymbolicWalk.unknown),
}


__all__ = ["Obj", "Pair", "PickleFacts", "facts_from_pickle"]
