"""A symbolic walk over one pickle's opcodes: what it would import and call, never running it.

pickletools only lists opcodes; to know which global a ``STACK_GLOBAL``
names, the walk keeps the unpickler's stack, mark stack and memo with
symbolic values (constants, globals, "something built at load time"). So a
module name fetched from the memo, pushed long before, or hidden inside a
tuple is still resolved; a name computed at load time cannot be, and is
reported as an unresolvable (dangerous) global. Calls of known loaders
(``pickle.loads``, ``torch.storage._load_from_bytes``, ...) on constant bytes
hand those bytes to the caller, which scans them as a nested pickle.

It is built as CPython's own unpickler is: one method per opcode, found in
a dispatch table. It follows that unpickler opcode by opcode (mark checks,
memo errors, line-based arguments) so that where the real unpickler would
stop, the walk stops too, and where it would go on, the walk does not give
up early; what it reached before a stop is reported all the same.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import BinaryIO, ClassVar

from ...model import GlobalRef
from .. import severity as levels
from ..inert import SHALLOW
from .values import (
    BYTES_IO,
    DILL,
    DILL_MODULE,
    GETATTR,
    IDIOM,
    LATIN1,
    NESTED_LOADERS,
    RESOLVED,
    SETATTR,
    UNKNOWN,
    BytesRef,
    Container,
    Finding,
    Glob,
    Made,
    OnEmbedded,
    Payload,
    Resolved,
    Stream,
    Unknown,
    Walk,
)

__all__ = ["NESTED_LOADERS", "BytesRef", "Finding", "Walk", "walk"]

from .judging import PERSISTENT_LOAD, Judging
from .state import WalkStop
from .vouch import FROM_TYPE, SHARDED_TENSOR, catalogued_nested, only_vouched, sharded_tensor_rebuild


def walk(
    f: BinaryIO,
    where: str,
    *,
    size: int,
    on_embedded: OnEmbedded | None = None,
    severity: Callable[[str, str], str] = levels.severity,
) -> Walk:
    """Walk the pickle that starts at ``f``'s position; ``size`` is where the stream ends."""
    return _Walker(f, where, size, on_embedded, severity).run()


class _Walker(Judging):
    """The walk: the data opcodes of WalkState plus globals, calls and objects, found by dispatch table."""

    dispatch: ClassVar[list[Callable[[_Walker], None] | None]] = []  # indexed by opcode byte

    def run(self) -> Walk:
        w, read, dispatch = self.w, self.read, self.dispatch
        try:
            while not self.done:  # the hot loop: 6 million opcodes for 200,000 tensors
                code = read(1)
                if not code:
                    raise WalkStop("pickle exhausted before STOP")
                self.opcodes += 1
                handler = dispatch[code[0]]
                if handler is None:
                    raise WalkStop(f"unknown opcode {code!r}")
                handler(self)
        except WalkStop as exc:
            w.error = f"{exc} (near offset {self.f.tell()})"
        except (ValueError, OverflowError, struct.error, UnicodeDecodeError, MemoryError) as exc:
            # A malformed argument: the real unpickler stops here too; what ran before is reported.
            w.error = f"malformed pickle: {exc} (near offset {self.f.tell()})"
        w.opcodes = self.opcodes
        if self.vouched:  # globals met only where a reviewed pattern vouches for them (walk/vouch.py)
            sure = [only_vouched(g, self.vouched, self.called, self.misused) for g in w.globals]
            w.globals = [GlobalRef(g.module, g.name, levels.SAFE, g.where) if ok else g
                         for g, ok in zip(w.globals, sure, strict=True)]
        if any(g.module in DILL for g in w.globals):
            w.globals = [
                GlobalRef(g.module, g.name, levels.SUSPICIOUS, g.where)
                if (g.module, g.name) in IDIOM and (g.module, g.name) not in self.misused
                and g.severity == levels.DANGEROUS else g
                for g in w.globals
            ]
        return w

    def call(self, func: object, args: object, how: str) -> object:
        """Model ``func(*args)``: evaluate what is knowable, report what is not."""
        if isinstance(func, Glob):
            return self.call_global(func, args, how)
        self.escape(args)
        if isinstance(func, (Made, Unknown)):
            what = f"the result of {func.by.module}.{func.by.name}" if isinstance(func, Made) and isinstance(
                func.by, Glob) else "an object built at load time"
            if how == "call":
                self.finding(levels.DANGEROUS, f"calls {what} (code the pickle constructed, e.g. a function)")
            else:
                self.finding(levels.DANGEROUS, f"instantiates {what} (a class the pickle constructed: its "
                             "construction runs code no allowlist vouches for)")
            if isinstance(args, tuple):
                self.pass_args(None, args, 0)
            return Made(func)
        raise WalkStop(f"{how} of a non-callable constant")

    def call_global(self, func: Glob, args: object, how: str) -> object:
        key = (func.module, func.name)
        if key in GETATTR and how == "call" and args.__class__ is tuple and catalogued_nested(args):
            # getattr(ShardedTensor, "ProcessGroupState"): how protocol 2 names a nested class; when the
            # dotted name is reviewed (the catalog), getattr only resolves a constant attribute: judged as that
            # name, and neither getattr nor the outer class counts as called
            outer, inner = args
            self.vouched.update((key, (outer.module, outer.name)))  # the outer class only spells the name
            return self.add_global(outer.module, f"{outer.name}.{inner}")
        self.pass_global_args(key, args, how)
        made = self.plain.get(key) if how == "call" else None
        if made is not None:  # judged before, and no rule below looks at it: 400k tensor rebuilds
            self.escape(args)
            return made
        argv = args if isinstance(args, tuple) else ()
        if key not in self.called:
            self.called.add(key)
            self.judge(key, "calls" if how == "call" and levels.function_like(key[1]) else "constructs")
        value = self.attribute_call(func, key, argv, how)
        if value is not None:
            return value
        if key in IDIOM:
            self.misused.add(key)
        self.escape(args)
        value = self.value_call(func, key, argv)
        if value is not None:
            return value
        made = Made(func)
        if how == "call" and _plain(key):
            self.plain[key] = made  # Made is immutable: one per callee serves every later call
        return made

    def pass_global_args(self, key: tuple[str, str], args: object, how: str) -> None:
        """The arguments a global is called with, judged as passed to it (a global passed on counts as called)."""
        if key in FROM_TYPE and how == "call" and args.__class__ is tuple and sharded_tensor_rebuild(args):
            # torch.save's ShardedTensor: rebuilt by _rebuild_wrapper_subclass, then __setstate__ with
            # init_rrefs=False only checks ranks (with it True, it would join an RPC agent: judged as usual)
            self.vouched.add(SHARDED_TENSOR)
            func_, _, inner, state = args
            self.pass_args(key, (func_, inner[1:], state), 0)
        elif args.__class__ is tuple and args:  # a global passed to a callee is judged as called (trampolines)
            if key in SHALLOW:  # the 400k tensor rebuilds: only their direct arguments count
                for a in args:
                    if a.__class__ in (Glob, Container):
                        self.pass_args(key, args, 0)
                        break
            else:
                self.pass_args(key, args, 0)

    def attribute_call(self, func: Glob, key: tuple[str, str], argv: tuple[object, ...], how: str) -> object | None:
        """getattr and setattr, whose meaning is in their arguments; None for any other callee."""
        if key in GETATTR and how == "call" and _dill_getattr(argv):
            return Glob("builtins", "setattr")
        if key in GETATTR and how == "call" and _nested_class(argv):  # protocol 2's getattr(Outer, "Inner")
            return self.add_global(argv[0].module, f"{argv[0].name}.{argv[1]}")  # type: ignore[attr-defined]
        if key in SETATTR and how == "call" and len(argv) == 3 and isinstance(argv[1], str):
            if isinstance(argv[0], Glob):
                self.finding(levels.DANGEROUS, f"setattr modifies the imported object "
                             f"{argv[0].module}.{argv[0].name} (module-level state)")
                self.misused.add(key)
            self.escape(argv[2])
            return Made(func)
        return None

    def value_call(self, func: Glob, key: tuple[str, str], argv: tuple[object, ...]) -> object | None:
        """Nested unpicklers (their payload walked too), BytesIO, and calls on constants; None for others."""
        if key in NESTED_LOADERS:
            payload = _as_bytes(argv[0]) if argv else None
            if payload is None:
                self.finding(levels.DANGEROUS,
                             f"{func.module}.{func.name} unpickles bytes computed at load time (cannot be checked)")
            elif self.on_embedded is not None:
                self.on_embedded(payload, f"{func.module}.{func.name}")
            return Made(func)
        if key in BYTES_IO and argv:
            return Stream(argv[0])
        return _constant_call(func, argv, self)

    # -- opcodes: globals, calls, objects ------------------------------------------------
    def read_global(self, encoding: str) -> Glob:
        raw_module, raw_name = self.readline(), self.readline()
        try:
            return self.add_global(raw_module.decode(encoding), raw_name.decode(encoding))
        except UnicodeDecodeError:
            raise WalkStop("global name is not valid text") from None

    def load_global(self) -> None:
        self.stack.append(self.read_global("utf-8"))

    def load_inst(self) -> None:
        if not self.metastack:
            raise WalkStop("INST without a MARK")  # CPython checks the mark before importing
        g = self.read_global("ascii")
        self.stack.append(self.call(g, tuple(self.pop_mark()), "instantiation"))

    def load_stack_global(self) -> None:
        name_v, module_v = self.pop(), self.pop()
        if isinstance(module_v, str) and isinstance(name_v, str):
            self.stack.append(self.add_global(module_v, name_v))
            return
        self.add_global("?", "?", levels.DANGEROUS)
        self.finding(levels.DANGEROUS, f"STACK_GLOBAL names a global computed at load time ({_describe(module_v)}."
                     f"{_describe(name_v)}), which cannot be resolved statically")
        self.stack.append(UNKNOWN)

    def load_ext(self, fmt: str) -> None:
        ext = self.unpack(fmt)
        self.add_global("?", f"<extension code {ext}>", levels.DANGEROUS)
        self.finding(levels.DANGEROUS, f"extension code {ext} names a global through copyreg's registry at load "
                     "time: which one the loading process decides, so no allowlist can vouch for what it calls")
        self.stack.append(UNKNOWN)

    def load_reduce(self) -> None:
        stack = self.stack
        if len(stack) < 2:
            raise WalkStop("stack underflow")
        args = stack.pop()
        func = stack.pop()
        if isinstance(func, Glob):
            self.w.plausible = True
            stack.append(self.call_global(func, args, "call"))
        else:
            stack.append(self.call(func, args, "call"))

    def load_newobj(self) -> None:
        args = self.pop()
        cls = self.pop()
        self.stack.append(self.call(cls, args, "instantiation"))

    def load_newobj_ex(self) -> None:
        self.pop()
        self.load_newobj()

    def load_obj(self) -> None:
        items = self.pop_mark()
        if not items:
            raise WalkStop("OBJ without a class")
        self.stack.append(self.call(items[0], tuple(items[1:]), "instantiation"))

    def load_build(self) -> None:
        state = self.pop()
        self.escape(state)
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], Container):
            self.slot_state(state[1])
        target = self.top()
        if isinstance(target, Glob):
            self.finding(levels.DANGEROUS,
                         f"BUILD sets attributes on the imported object {target.module}.{target.name}")
        elif target.__class__ is Resolved:
            self.finding(levels.DANGEROUS, "BUILD on an object the loader's persistent_load returned: its "
                         "__setstate__ runs with the pickle's state (no allowlist vouches for it)")

    def load_persid(self) -> None:
        self.readline()
        self.stack.append(RESOLVED)

    def load_binpersid(self) -> None:
        if not self.stack:
            raise WalkStop("stack underflow")
        pid = self.stack.pop()
        self.escape(pid)
        if type(pid) is tuple:
            if len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[2], str):
                self.w.storage_keys.add(pid[2])
            for a in pid:  # torch's persistent_load uses the storage type it names: judged as called
                cls = a.__class__  # inline: one persistent id per tensor, naming the memoized storage type
                if cls is Glob:
                    if a is not self.pid_glob:
                        self.pid_glob = a  # held here, so its identity stays its own
                        if (a.module, a.name) not in self.called:
                            self.judge_arg(a, PERSISTENT_LOAD)
                elif cls is tuple:
                    self.pass_args(PERSISTENT_LOAD, a, 1)
        self.stack.append(RESOLVED)

    def load_stop(self) -> None:
        self.escape(self.pop())
        self.w.end = self.f.tell()
        self.done = True


def _opcodes() -> list[Callable[[_Walker], None] | None]:
    """opcode byte -> handler (None: unknown), as pickle.py's ``_Unpickler.dispatch``."""
    w = _Walker
    table: dict[bytes, Callable[[_Walker], None]] = {
        b"\x80": w.load_proto, b"\x95": w.load_frame, b"K": w.load_binint1, b"M": w.load_binint2,
        b"J": w.load_binint, b"\x8a": w.load_long1, b"\x8b": w.load_long4, b"I": w.load_int, b"L": w.load_long,
        b"F": w.load_float, b"G": w.load_binfloat, b"N": w.load_none, b"\x88": w.load_true, b"\x89": w.load_false,
        b"S": w.load_string, b"T": w.load_binstring, b"U": w.load_short_binstring, b"V": w.load_unicode,
        b"X": w.load_binunicode, b"\x8d": w.load_binunicode8, b"\x8c": w.load_short_binunicode,
        b"B": w.load_binbytes, b"C": w.load_short_binbytes, b"\x8e": w.load_binbytes8, b"\x96": w.load_binbytes8,
        b"\x97": w.load_next_buffer, b"\x98": w.load_readonly_buffer,
        b"]": w.load_empty_list, b"}": w.load_empty_dict, b"\x8f": w.load_empty_set, b")": w.load_empty_tuple,
        b"t": w.load_tuple, b"\x85": w.load_tuple1, b"\x86": w.load_tuple2, b"\x87": w.load_tuple3,
        b"l": w.load_list, b"d": w.load_dict, b"\x91": w.load_frozenset,
        b"a": w.load_append, b"e": w.load_appends, b"\x90": w.load_additems, b"s": w.load_setitem,
        b"u": w.load_setitems,
        b"(": w.load_mark, b"0": w.load_pop, b"1": w.load_pop_mark, b"2": w.load_dup, b"g": w.load_get,
        b"h": w.load_binget, b"j": w.load_long_binget, b"p": w.load_put, b"q": w.load_binput,
        b"r": w.load_long_binput, b"\x94": w.load_memoize,
        b"c": w.load_global, b"i": w.load_inst, b"\x93": w.load_stack_global,
        b"\x82": lambda s: s.load_ext("<B"), b"\x83": lambda s: s.load_ext("<H"), b"\x84": lambda s: s.load_ext("<i"),
        b"R": w.load_reduce, b"\x81": w.load_newobj, b"\x92": w.load_newobj_ex, b"o": w.load_obj,
        b"b": w.load_build, b"P": w.load_persid, b"Q": w.load_binpersid, b".": w.load_stop,
    }
    handlers: list[Callable[[_Walker], None] | None] = [None] * 256
    for code, handler in table.items():
        handlers[code[0]] = handler
    return handlers


_Walker.dispatch = _opcodes()


def _plain(key: tuple[str, str]) -> bool:
    """A callee no rule of call_global or _constant_call looks at (its calls all come out ``Made``)."""
    return not (key in GETATTR or key in SETATTR or key in IDIOM or key in NESTED_LOADERS or key in BYTES_IO
                or key == ("_codecs", "encode") or key[0] in DILL
                or (key[0] in ("builtins", "__builtin__") and key[1] in ("bytes", "bytearray", "str")))


def _as_bytes(value: object) -> Payload | None:
    if isinstance(value, Stream):
        value = value.payload
    if isinstance(value, (bytes, BytesRef)):
        return value
    if isinstance(value, str):
        return value.encode("latin-1", "replace")
    return None


def _constant_call(func: Glob, argv: tuple[object, ...], walker: _Walker) -> object | None:
    """The value of a call the walk can evaluate on constants (bytes, str, encode), else None."""
    if (func.module, func.name) == ("_codecs", "encode") and argv and isinstance(argv[0], str):
        enc = argv[1] if len(argv) > 1 and isinstance(argv[1], str) else "utf-8"
        return argv[0].encode("latin-1" if enc.lower() in LATIN1 else "utf-8", "surrogatepass")
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
    if func.module in DILL and func.name == "_create_type" and argv:
        maker = argv[0]
        if not (isinstance(maker, Glob) or (isinstance(maker, Made) and isinstance(maker.by, Glob)
                                            and maker.by.name == "_load_type")):
            walker.finding(levels.DANGEROUS, "dill._create_type calls an object built by the pickle")
    return None


def _dill_getattr(argv: tuple[object, ...]) -> bool:
    """``getattr(dill._dill, "_setattr"[, setattr])``: dill's way to reach setattr."""
    if len(argv) not in (2, 3) or argv[1] != "_setattr":
        return False
    mod = argv[0]
    if not (isinstance(mod, Glob) and (mod.module, mod.name) in DILL_MODULE):
        return False
    return len(argv) == 2 or (isinstance(argv[2], Glob) and (argv[2].module, argv[2].name) in SETATTR)


def _nested_class(argv: tuple[object, ...]) -> bool:
    """``getattr(Outer, "Inner")`` of a global (ShardedTensor.ProcessGroupState): a class named by its path,
    judged like protocol 4's dotted name; getattr itself stays judged as called."""
    return len(argv) == 2 and isinstance(argv[0], Glob) and isinstance(argv[1], str) and argv[1].isidentifier() \
        and argv[1][:1].isupper()


def _describe(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, Made) and isinstance(value.by, Glob):
        return f"<result of {value.by.module}.{value.by.name}>"
    return "<computed>"
