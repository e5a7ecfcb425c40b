"""The symbolic values a pickle walk keeps on its stack, and the known-loader tables it consults."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...model import GlobalRef

SMALL = 1 << 16  # bytes/str arguments above this are referenced by offset, not held
MAX_LINE = 1 << 20  # longest text line a protocol-0 opcode may carry


class Unknown:
    """A value the walk cannot know: a persistent id, a computed result, ..."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = Unknown()


class Resolved(Unknown):
    """What a persistent id resolves to: an object the loader's persistent_load builds (torch: a storage)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<persistent object>"


RESOLVED = Resolved()


class Container(Unknown):
    """A list, dict, set or frozenset the pickle builds: its contents are not tracked, its kind is.

    The kind matters: SETITEM(S) on anything but a dict is the opcode
    confusion behind CVE-2026-24747. The globals put in it (and containers
    holding some) are kept in ``globs``, at most MAX_HELD: handed to a call,
    they are judged as called (``func(*[cls, ...])`` works with a list too).
    """

    __slots__ = ("globs", "kind")

    def __init__(self, kind: str, items: list[object] | tuple[object, ...] = ()) -> None:
        self.kind = kind
        self.globs: list[object] | None = None
        if items:
            self.hold(items)

    def hold(self, items: list[object] | tuple[object, ...]) -> None:
        for v in items:
            cls = v.__class__
            if cls is Glob or (cls is Container and v.globs):  # type: ignore[attr-defined]  # cls is Container
                if self.globs is None:
                    self.globs = []
                if len(self.globs) < MAX_HELD:
                    self.globs.append(v)

    def __repr__(self) -> str:
        return f"<{self.kind}>"


MAX_HELD = 64  # globals a container remembers (each distinct global is judged once anyway)


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
    glob: str = ""  # "module.name" of the global the finding is about, if any (what --allow-global lifts)


Payload = bytes | BytesRef
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
    storage_keys: set[str] = field(default_factory=set)  # keys of torch's ("storage", type, key, ...) ids

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
BYTES_IO = frozenset([("io", "BytesIO"), ("_io", "BytesIO")])
LATIN1 = frozenset(["latin1", "latin-1", "iso-8859-1", "iso8859-1", "l1"])
DILL = ("dill._dill", "dill.dill", "dill")
# dill's own idiom for closures: getattr(dill._dill, "_setattr", setattr)(cell, "cell_contents", v).
# In a dill pickle these globals are downgraded to suspicious when every use of them is that idiom.
GETATTR = frozenset([("builtins", "getattr"), ("__builtin__", "getattr")])
SETATTR = frozenset([("builtins", "setattr"), ("__builtin__", "setattr"), ("dill._dill", "_setattr"),
                      ("dill.dill", "_setattr")])
DILL_MODULE = frozenset([("dill", "_dill"), ("dill", "dill")])
IDIOM = GETATTR | SETATTR | DILL_MODULE
