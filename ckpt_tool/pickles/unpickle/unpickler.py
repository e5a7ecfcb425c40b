"""The restricted unpickler: the only place pickled bytes are turned into objects.

Nothing named in a pickle is ever imported or called. A short allowlist of
globals is served by ckpt's own inert re-implementations (rebuilders.py:
tensor rebuilds produce LazyTensors that describe storages without reading
them; containers are plain Python containers). Every other global becomes a
Placeholder class (placeholders.py) that records what the pickle tried to do
with it, so a whole-model pickle, an argparse.Namespace or an os.system
payload is read as data and reported.
"""
from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any

from ...errors import InputError, LimitExceeded
from ...limits import DEFAULT_LIMITS, Limits
from ...model import GlobalRef
from .. import severity
from . import guard
from .placeholders import StorageType, placeholder_class
from .rebuilders import ALLOWED, torch_global


@dataclass
class UnpickleResult:
    obj: Any
    references: list[GlobalRef] = field(default_factory=list)
    data: bytes | None = None  # the pickle's bytes, when read from a stream


# Reads torch.save bytes nested in a pickle: (bytes, path=, where=, limits=) -> (object, globals).
# The format readers pass theirs in (formats/torchsave/inmemory.py); this layer never imports them.
BlobReader = Callable[..., "tuple[Any, list[GlobalRef]]"]


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class never imports and whose persistent ids stay lazy."""

    def __init__(
        self,
        file: io.BufferedIOBase,
        *,
        where: str,
        persistent_load: Callable[[Any], Any] | None = None,
        path: str = "",
        limits: Limits = DEFAULT_LIMITS,
        read_blob: BlobReader | None = None,
    ) -> None:
        super().__init__(file)
        self.read_blob = read_blob
        self.where = where
        self.path = path
        self.limits = limits
        self.references: list[GlobalRef] = []
        self._seen: set[tuple[str, str]] = set()
        if persistent_load is not None:
            # The C unpickler calls it directly (no method in between): once per tensor.
            self.persistent_load = persistent_load  # type: ignore[method-assign]
        self._nested = 0
        self._served: dict[int, tuple[Any, dict[str, Any], tuple[str, str]]] = {}

    def find_class(self, module: str, name: str) -> Any:  # the name pickle.Unpickler calls
        module, name = str(module), str(name)
        key = (module, name)
        if key not in self._seen:
            self._seen.add(key)
            self.references.append(GlobalRef(module, name, severity.severity(module, name), self.where))
        found = self._stand_in(key)
        if (type(found) is FunctionType or (isinstance(found, type) and found.__flags__ & _HEAPTYPE)) and (
                id(found) not in self._served):
            self._served[id(found)] = (found, dict(vars(found)), key)  # BUILD must not change it: checked after
        return found

    def _stand_in(self, key: tuple[str, str]) -> Any:
        if key in ALLOWED:
            return ALLOWED[key]
        if key == ("torch.storage", "_load_from_bytes"):
            return self._load_from_bytes
        if key[0] == "torch":
            found = torch_global(key[1])
            if found is not None:
                return found
        if key in (("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage")):
            return StorageType("UntypedStorage", None)
        return placeholder_class(*key)

    def restore_stand_ins(self) -> list[tuple[str, str]]:
        """Undo what BUILD did to the functions and classes this pickle named; say which it changed.

        ckpt's stand-ins (and Counter, a Python class) are shared by every read in
        the process: a pickle that sets attributes on one (BUILD on a global, which
        the static walk calls dangerous) must not change how the next file reads.
        """
        changed = []
        for obj, before, key in self._served.values():
            now = vars(obj)
            if len(now) == len(before) and all(now.get(a, _MISSING) is v for a, v in before.items()):
                continue
            changed.append(key)
            if isinstance(obj, type):
                for attr in [a for a in now if a not in before]:
                    delattr(obj, attr)
                for attr, value in before.items():
                    if now.get(attr, _MISSING) is not value:
                        setattr(obj, attr, value)
            else:
                obj.__dict__.clear()
                obj.__dict__.update(before)
        self._served.clear()
        return changed

    def _load_from_bytes(self, data: Any) -> Any:
        """``torch.storage._load_from_bytes(b)``: what ``pickle.dump(tensor)`` writes.

        ``b`` is a whole torch.save blob; it is parsed by ckpt's own restricted
        readers (never torch.load) and the globals it names are reported too.
        """
        if not isinstance(data, (bytes, bytearray)):
            raise pickle.UnpicklingError("torch.storage._load_from_bytes called with something other than bytes")
        depth = getattr(_NESTING, "depth", 0)
        if depth >= MAX_NESTED_BLOBS:
            raise pickle.UnpicklingError("torch.save bytes are nested inside each other too deeply")
        if self.read_blob is None:
            raise pickle.UnpicklingError("holds torch.save bytes (torch.storage._load_from_bytes) that this "
                                         "reader does not follow")
        self._nested += 1
        _NESTING.depth = depth + 1
        try:
            obj, refs = self.read_blob(
                bytes(data), path=self.path, where=f"{self.where} > torch.save bytes #{self._nested}",
                limits=self.limits,
            )
        finally:
            _NESTING.depth = depth
        for ref in refs:
            if (ref.module, ref.name) not in self._seen:
                self._seen.add((ref.module, ref.name))
                self.references.append(ref)
        return obj


# Pickles are unpickled one at a time (shards read on threads included): a change to a shared stand-in
# is then put back and blamed on the pickle that made it. Reentrant: torch.save bytes nest. CPU-bound
# under the GIL anyway, so nothing is lost.
_ONE_AT_A_TIME = threading.RLock()
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, whose attributes BUILD can set
_MISSING = object()

# torch.save bytes inside a pickle inside torch.save bytes ...: a real file nests once.
MAX_NESTED_BLOBS = 8
_NESTING = threading.local()


def restricted_loads(
    data: bytes,
    *,
    where: str,
    path: str,
    persistent_load: Callable[[Any], Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
    read_blob: BlobReader | None = None,
    opcodes: set[int] | None = None,
) -> UnpickleResult:
    """Unpickle ``data`` without importing or calling anything it names.

    ``opcodes`` collects what the weights_only predictor needs (guard.walk's ``seen``).
    """
    if len(data) > limits.max_pickle_bytes:
        raise LimitExceeded(
            f"{where} is {len(data)} bytes, over the pickle limit of {limits.max_pickle_bytes} "
            "(raise it with --max-pickle-bytes)",
            path,
        )
    guard.check_bytes(data, where=where, path=path, seen=opcodes)
    unpickler = RestrictedUnpickler(io.BytesIO(data), where=where, persistent_load=persistent_load,
                                    path=path, limits=limits, read_blob=read_blob)
    return _run(unpickler, where, path)


def restricted_load_stream(
    stream: Any,
    *,
    where: str,
    path: str,
    persistent_load: Callable[[Any], Any] | None = None,
    limits: Limits = DEFAULT_LIMITS,
    read_blob: BlobReader | None = None,
    opcodes: set[int] | None = None,
) -> UnpickleResult:
    """Unpickle one pickle from a binary stream, leaving it just past the STOP opcode.

    Formats that put several pickles and raw bytes one after another (legacy
    torch files) read each pickle this way; the caller bounds the stream.
    The pickle's bytes are checked (pickle_guard) before they are unpickled.
    """
    data = guard.read_one(stream, where=where, path=path, max_bytes=limits.max_pickle_bytes, seen=opcodes)
    unpickler = RestrictedUnpickler(io.BytesIO(data), where=where, persistent_load=persistent_load,
                                    path=path, limits=limits, read_blob=read_blob)
    result = _run(unpickler, where, path)
    result.data = data
    return result


def _run(unpickler: RestrictedUnpickler, where: str, path: str) -> UnpickleResult:
    with _ONE_AT_A_TIME:
        obj, changed = _load(unpickler, where, path)
    if changed:  # BUILD on a global: dangerous, as the static walk says (which this makes every command run)
        unpickler.references[:] = [GlobalRef(r.module, r.name, severity.DANGEROUS, r.where)
                                   if (r.module, r.name) in changed else r for r in unpickler.references]
    return UnpickleResult(obj, unpickler.references)


def _load(unpickler: RestrictedUnpickler, where: str, path: str) -> tuple[Any, list[tuple[str, str]]]:
    try:
        obj = unpickler.load()
    except InputError:
        raise
    except RecursionError:
        raise InputError(f"{where} is nested too deeply to read", path) from None
    except MemoryError:
        raise LimitExceeded(f"{where} asks for more memory than is available", path) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, LookupError,
            AttributeError, UnicodeDecodeError, OverflowError, struct_error()) as exc:
        # Any of these means the bytes are not a well-formed pickle of the
        # shapes we rebuild; the message names the file, never a traceback.
        detail = str(exc) or exc.__class__.__name__
        if isinstance(exc, EOFError) or "truncated" in detail:
            detail = "the pickle is truncated"
        raise InputError(f"{where} is not a readable pickle: {detail}", path) from exc
    finally:
        changed = unpickler.restore_stand_ins()
    return obj, changed


def struct_error() -> type[Exception]:
    import struct

    return struct.error
