"""The facts about one pickle that the weights_only predictor needs, by a static symbolic walk.

``facts_from_pickle(bytes)`` runs a ``pickletools`` pass that tracks what
each stack value is (a global, the result of a call, a dict, a list, ...)
without unpickling anything, and records every call, BUILD, SETITEM(S) and
APPEND(S) with the object it acts on (see ``PickleFacts``). It costs about
1.5 microseconds per opcode: wo_input.py runs it only where the cheap facts
the readers record while unpickling cannot decide.
"""
from __future__ import annotations

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

    stack: list[object] = []
    marks: list[list[object]] = []
    memo: dict[int, object] = {}
    opcodes: set[str] = set()
    globs: dict[Pair, None] = {}
    calls: list[Obj] = []
    builds: dict[Obj, None] = {}
    setitems: dict[Obj, None] = {}
    appends: dict[Obj, None] = {}
    pids: list[str] = []
    protocol = 0

    def pop() -> object:
        return stack.pop() if stack else _UNKNOWN

    def top() -> object:
        return stack[-1] if stack else _UNKNOWN

    def pop_mark() -> list[object]:
        nonlocal stack
        items, stack = stack, (marks.pop() if marks else [])
        return items

    def as_obj(value: object) -> Obj:
        return value if isinstance(value, Obj) else Obj("tuple") if isinstance(value, tuple) else Obj("const")

    def call(func: object, args: object, opcode: str) -> Obj:
        first = args[0] if isinstance(args, tuple) and args else None
        name = func.name if isinstance(func, Obj) and func.kind == "global" else None
        made = Obj("call", name, opcode, first if isinstance(first, str) else None,
                   first.name if isinstance(first, Obj) and first.kind == "global" else None)
        calls.append(made)
        return made

    try:
        for op, arg, _pos in genops(data):
            name = op.name
            opcodes.add(name)
            if name == "PROTO":
                protocol = int(arg)  # type: ignore[arg-type]
            elif name in _CONST_OPS:
                stack.append(arg)
            elif name in ("GLOBAL", "INST"):
                module, _, gname = str(arg).partition(" ")
                globs[(module, gname)] = None
                g = Obj("global", (module, gname))
                made = g if name == "GLOBAL" else call(g, tuple(pop_mark()), "INST")
                stack.append(made)  # after pop_mark, which rebinds ``stack``
            elif name == "STACK_GLOBAL":
                gname_v, module_v = pop(), pop()
                if isinstance(module_v, str) and isinstance(gname_v, str):
                    globs[(module_v, gname_v)] = None
                    stack.append(Obj("global", (module_v, gname_v)))
                else:
                    stack.append(_UNKNOWN)
            elif name == "REDUCE":
                args = pop()
                func = pop()
                made = call(func, args, name)
                if isinstance(func, Obj) and func.name in _GETATTR and isinstance(args, tuple) and len(args) == 2 \
                        and isinstance(args[0], Obj) and args[0].kind == "global" and isinstance(args[1], str):
                    # protocol 2 names a nested class as getattr(Outer, "Inner"): the value is that global
                    made = Obj("global", (args[0].name[0], f"{args[0].name[1]}.{args[1]}"))  # type: ignore[index]
                stack.append(made)
            elif name == "NEWOBJ":
                args = pop()
                stack.append(call(pop(), args, name))
            elif name == "NEWOBJ_EX":
                pop()
                args = pop()
                stack.append(call(pop(), args, name))
            elif name == "OBJ":
                items = pop_mark()
                stack.append(call(items[0] if items else _UNKNOWN, tuple(items[1:]), name))
            elif name == "BUILD":
                pop()
                builds[as_obj(top())] = None
            elif name in ("SETITEM", "SETITEMS"):
                if name == "SETITEM":
                    pop(), pop()
                else:
                    pop_mark()
                setitems[as_obj(top())] = None
            elif name in ("APPEND", "APPENDS", "ADDITEMS"):
                if name == "APPEND":
                    pop()
                else:
                    pop_mark()
                appends[as_obj(top())] = None
            elif name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "DICT", "LIST", "FROZENSET"):
                if name in ("DICT", "LIST", "FROZENSET"):
                    pop_mark()
                stack.append(Obj({"EMPTY_DICT": "dict", "DICT": "dict", "EMPTY_LIST": "list", "LIST": "list"}.get(
                    name, "set")))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "TUPLE":
                items = pop_mark()
                stack.append(tuple(items))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = [pop() for _ in range(n)][::-1]
                stack.append(tuple(items))
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name == "POP":
                pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(top())
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = top()  # type: ignore[arg-type]
            elif name == "MEMOIZE":
                memo[len(memo)] = top()
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(int(arg), _UNKNOWN))  # type: ignore[arg-type]
            elif name in ("BINPERSID", "PERSID"):
                pid = pop() if name == "BINPERSID" else arg
                head = pid[0] if isinstance(pid, tuple) and pid else None
                head = head.decode("ascii", "replace") if isinstance(head, bytes) else head
                pids.append(head if isinstance(head, str) else "?")
                stack.append(_UNKNOWN)
            elif name in ("EXT1", "EXT2", "EXT4", "NEXT_BUFFER"):
                stack.append(_UNKNOWN)
    except (ValueError, EOFError) as exc:  # a malformed stream: torch refuses it too
        return PickleFacts(protocol, frozenset(opcodes), tuple(globs), error=str(exc))
    return PickleFacts(protocol, frozenset(opcodes), tuple(globs), tuple(calls), tuple(builds), tuple(setitems),
                       tuple(appends), tuple(pids))


__all__ = ["Obj", "Pair", "PickleFacts", "facts_from_pickle"]
