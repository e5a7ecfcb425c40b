"""The restricted unpickler: the only place pickled bytes are turned into objects.

Nothing named in a pickle is ever imported or called. A short allowlist of
globals is served by ckpt's own inert re-implementations (tensor rebuilds
produce LazyTensors that describe storages without reading them; containers
are plain Python containers). Every other global becomes a Placeholder class
that records what the pickle tried to do with it, so a whole-model pickle, an
argparse.Namespace or an os.system payload is read as data and reported.
"""
from __future__ import annotations

import builtins
import codecs
import io
import pickle
import threading
from collections import Counter, OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import dtypes
from ..errors import InputError, LimitExceeded
from ..model import GlobalRef, StorageRef
from . import guard, severity

# --------------------------------------------------------------------------- data


class LazyStorage(StorageRef):
    """A storage named by a pickle's persistent id; its bytes stay on disk.

    It is its own StorageRef (the dtype and device the pickle gave it on
    top): readers make one per tensor, and a 200,000-tensor file must read
    in about a second, so one object does both jobs.
    """

    __slots__ = ("dtype", "location")

    def __init__(self, key: str, dtype: dtypes.DType, nbytes: int, location: str = "cpu", source: Any = None) -> None:
        self.source = source  # the DataSource that can read it, set by the format reader
        self.key = key
        self.nbytes = nbytes
        self.dtype = dtype
        self.location = location

    @property
    def ref(self) -> StorageRef | None:
        """The StorageRef every tensor viewing this storage shares (None without a source)."""
        return self if self.source is not None else None

    def __repr__(self) -> str:
        return f"LazyStorage({self.key!r}, {self.dtype.name}, {self.nbytes} bytes, {self.location})"


class LazyTensor:
    """What ``torch._utils._rebuild_tensor_v2`` would build, as metadata.

    The constructor takes ``_rebuild_tensor_v2``'s arguments, so the
    unpickler builds one per tensor with a single call (200,000 in some
    files); ``meta`` builds the storage-less tensors of other rebuilds.
    """

    __slots__ = ("storage", "storage_offset", "shape", "stride", "dtype", "requires_grad", "is_parameter", "subclass")

    def __init__(
        self, storage: Any, storage_offset: int, size: Any, stride: Any, requires_grad: Any = False,
        backward_hooks: Any = None, metadata: Any = None,
    ) -> None:
        if type(storage) is not LazyStorage:
            raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
        self.storage: LazyStorage | None = storage
        self.storage_offset = storage_offset
        self.shape: tuple[int, ...] = size if type(size) is tuple else tuple(size)
        self.stride: tuple[int, ...] = stride if type(stride) is tuple else tuple(stride)
        self.dtype: dtypes.DType = storage.dtype
        self.requires_grad = bool(requires_grad)
        self.is_parameter = False
        self.subclass: str | None = None

    @classmethod
    def meta(cls, dtype: dtypes.DType, shape: tuple[int, ...], stride: tuple[int, ...],
             requires_grad: bool = False) -> LazyTensor:
        """A tensor without a storage (saved on the meta device)."""
        t = cls.__new__(cls)
        t.storage, t.storage_offset, t.shape, t.stride, t.dtype = None, 0, shape, stride, dtype
        t.requires_grad, t.is_parameter, t.subclass = requires_grad, False, None
        return t

    @property
    def device(self) -> str:
        if self.storage is None:
            return "meta"
        return self.storage.location

    def __repr__(self) -> str:
        return f"LazyTensor({self.dtype.name}, {list(self.shape)})"


@dataclass
class NumpyArray:
    """A NumPy array from a pickle: dtype, shape and its bytes (inline in the pickle)."""

    dtype: dtypes.DType | None = None
    shape: tuple[int, ...] = ()
    fortran: bool = False
    data: bytes = b""
    type_string: str = ""


@dataclass
class DTypeRef:
    """``torch.float32`` and friends, named by the pickle."""

    name: str


@dataclass
class StorageType:
    """``torch.FloatStorage`` and friends: a dtype for persistent ids."""

    name: str
    dtype: dtypes.DType | None


class Placeholder:
    """An inert stand-in for an instance of a class ckpt refused to import.

    It records constructor arguments, state and items, and does nothing else.
    """

    _ckpt_module = ""
    _ckpt_name = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        obj = object.__new__(cls)
        d = obj.__dict__
        d["_ckpt_args"] = args
        d["_ckpt_kwargs"] = kwargs
        d["_ckpt_state"] = None
        d["_ckpt_items"] = []
        d["_ckpt_setitems"] = {}
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_ckpt_state"] = state

    def append(self, item: Any) -> None:
        self.__dict__["_ckpt_items"].append(item)

    def extend(self, items: Any) -> None:
        self.__dict__["_ckpt_items"].extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__["_ckpt_setitems"][key] = value

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        name = f"{self.qualname}(...)"
        if len(name) > 200:  # f(x)(x)(x)... 10,000 times: names (and memory) would grow quadratically
            name = name[:100] + "...(...)"
        return _placeholder_class("<call>", name)(*args, **kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"placeholder for {self.qualname} cannot be pickled as the real object")

    @property
    def qualname(self) -> str:
        return f"{self._ckpt_module}.{self._ckpt_name}"

    @property
    def args(self) -> tuple[Any, ...]:
        return self.__dict__["_ckpt_args"]

    @property
    def state(self) -> Any:
        return self.__dict__["_ckpt_state"]

    @property
    def attributes(self) -> dict[str, Any]:
        """The object's ``__dict__`` as pickled (state dict, or dict part of (dict, slots))."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))):
            merged = dict(state[0] or {})
            if isinstance(state[1], dict):
                merged.update(state[1])
            return merged
        if isinstance(state, dict):
            return state
        return {}

    def __repr__(self) -> str:
        return f"<placeholder {self.qualname}>"


_PLACEHOLDER_CLASSES: dict[tuple[str, str], type[Placeholder]] = {}
# A file can name any number of globals; a process reading many files (a scanning
# service, a fuzzer) must not keep a class for each forever. Classes still in use
# live on in their objects.
MAX_CACHED_PLACEHOLDER_CLASSES = 10_000


def _placeholder_class(module: str, name: str) -> type[Placeholder]:
    key = (module, name)
    cls = _PLACEHOLDER_CLASSES.get(key)
    if cls is None:
        if len(_PLACEHOLDER_CLASSES) >= MAX_CACHED_PLACEHOLDER_CLASSES:
            _PLACEHOLDER_CLASSES.clear()
        cls = type(
            name if name.isidentifier() else "Placeholder",
            (Placeholder,),
            {"_ckpt_module": module, "_ckpt_name": name, "__module__": "ckpt_tool.placeholders"},
        )
        _PLACEHOLDER_CLASSES[key] = cls
    return cls


def is_module_placeholder(obj: Any) -> bool:
    """True for a placeholder whose state looks like an nn.Module's ``__dict__``."""
    if not isinstance(obj, Placeholder):
        return False
    attrs = obj.attributes
    return "_parameters" in attrs and "_modules" in attrs


# ------------------------------------------------------------- safe re-implementations


# torch._utils._rebuild_tensor(storage, offset, size, stride) and _rebuild_tensor_v2(..., requires_grad,
# backward_hooks, metadata=None): LazyTensor's constructor takes exactly these arguments.
_rebuild_tensor = _rebuild_tensor_v2 = LazyTensor


def _rebuild_tensor_v3(
    storage: Any, storage_offset: int, size: Any, stride: Any, requires_grad: Any,
    backward_hooks: Any, dtype: Any, metadata: Any = None,
) -> LazyTensor:
    if not isinstance(dtype, DTypeRef) or dtype.name not in dtypes.BY_NAME:
        raise pickle.UnpicklingError(f"unsupported tensor dtype {getattr(dtype, 'name', dtype)!r}")
    if not isinstance(storage, LazyStorage):
        raise pickle.UnpicklingError("tensor rebuilt from something that is not a storage")
    storage.dtype = dtypes.BY_NAME[dtype.name]
    return LazyTensor(storage, int(storage_offset), tuple(size), tuple(stride), requires_grad)


def _rebuild_parameter(data: Any, requires_grad: Any = True, backward_hooks: Any = None,
                       state: Any = None) -> Any:
    if isinstance(data, LazyTensor):
        data.is_parameter = True
        data.requires_grad = bool(requires_grad)
    return data


def _rebuild_meta(dtype: Any, size: Any, stride: Any, requires_grad: Any = False) -> LazyTensor:
    name = getattr(dtype, "name", "float32")
    return LazyTensor.meta(dtypes.BY_NAME.get(name, dtypes.BY_NAME["float32"]), tuple(size), tuple(stride),
                           bool(requires_grad))


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func not in _REBUILDERS:
        raise pickle.UnpicklingError("tensor subclass rebuilt by an unknown function")
    result = func(*args)
    if isinstance(result, LazyTensor) and isinstance(new_type, type) and issubclass(new_type, Placeholder):
        result.subclass = f"{new_type._ckpt_module}.{new_type._ckpt_name}"
    return result


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if not isinstance(obj, str) or codecs.lookup(encoding).name not in ("latin-1", "iso8859-1", "utf-8"):
        raise pickle.UnpicklingError("_codecs.encode used for something other than bytes")
    return obj.encode(encoding, errors)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    if isinstance(cls, type) and issubclass(cls, Placeholder):
        return cls()
    if cls in (OrderedDict, dict, list, set):
        return cls() if state is None else cls(state)
    raise pickle.UnpicklingError("copyreg._reconstructor of a class ckpt does not rebuild")


def _newobj(cls: Any, *args: Any) -> Any:
    if isinstance(cls, type) and (issubclass(cls, Placeholder) or cls in _SAFE_TYPES):
        return cls.__new__(cls, *args)
    raise pickle.UnpicklingError("copyreg.__newobj__ of a class ckpt does not rebuild")


def _torch_size(dims: Any = ()) -> tuple[int, ...]:
    return tuple(int(d) for d in dims)


def _torch_device(spec: Any, index: Any = None) -> str:
    spec = str(spec)
    return f"{spec}:{index}" if index is not None and ":" not in spec else spec


def _get_layout(name: Any) -> str:
    return str(name)


class _NumpyDType:
    """``numpy.dtype('f4', False, True)`` + BUILD state, without NumPy."""

    def __init__(self, code: Any = "", align: Any = False, copy: Any = True) -> None:
        self.code = str(code)
        self.order = "|"

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str):
            self.order = state[1]

    def resolve(self) -> dtypes.DType | None:
        order = "<" if self.order in ("<", "=", "|") else self.order
        if order == ">":
            return None  # big-endian arrays are listed as unsupported rather than misread
        return dtypes.BY_NUMPY.get(self.code) or dtypes.BY_NUMPY.get("<" + self.code.lstrip("<|="))


class _NumpyArrayBuilder(NumpyArray):
    def __setstate__(self, state: Any) -> None:
        # (version, shape, dtype, is_fortran, rawdata)
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError("unexpected NumPy array state")
        _, shape, dt, fortran, raw = state
        self.shape = tuple(int(d) for d in shape)
        self.fortran = bool(fortran)
        if isinstance(dt, _NumpyDType):
            self.type_string = self.order_code(dt)
            self.dtype = dt.resolve()
        if isinstance(raw, (bytes, bytearray)):
            self.data = bytes(raw)
        elif isinstance(raw, list):
            # an object array: its items were unpickled (restricted) like any others; it is
            # metadata, never a tensor (dtype None), so a file holding one still reads
            self.dtype = None
            self.type_string = "object"
            self.data = b""

    @staticmethod
    def order_code(dt: _NumpyDType) -> str:
        return dt.order + dt.code


def _np_reconstruct(cls: Any, shape: Any, typecode: Any) -> NumpyArray:
    return _NumpyArrayBuilder()


def _np_scalar(dt: Any, data: Any = None) -> Any:
    import struct

    resolved = dt.resolve() if isinstance(dt, _NumpyDType) else None
    if resolved is None or not isinstance(data, (bytes, bytearray)):
        return _placeholder_class("numpy", "scalar")(dt, data)
    fmt = {"float64": "<d", "float32": "<f", "float16": "<e", "int64": "<q", "int32": "<i",
           "int16": "<h", "int8": "<b", "uint8": "<B", "uint16": "<H", "uint32": "<I",
           "uint64": "<Q", "bool": "<?"}.get(resolved.name)
    if fmt is None or struct.calcsize(fmt) != len(data):
        return _placeholder_class("numpy", "scalar")(dt, data)
    return struct.unpack(fmt, bytes(data))[0]


def _np_frombuffer(buf: Any, dt: Any, shape: Any, order: Any = "C") -> NumpyArray:
    """``numpy._core.numeric._frombuffer``: how NumPy pickles arrays with protocol 5."""
    if not isinstance(buf, (bytes, bytearray)):
        raise pickle.UnpicklingError("NumPy array data is not in the pickle (out-of-band buffer)")
    arr = _NumpyArrayBuilder()
    arr.shape = tuple(int(d) for d in shape)
    arr.fortran = order == "F"
    if isinstance(dt, _NumpyDType):
        arr.type_string = arr.order_code(dt)
        arr.dtype = dt.resolve()
    arr.data = bytes(buf)
    return arr


def _dill_create_type(typeobj: Any, name: Any, bases: Any = (), namespace: Any = None) -> type[Placeholder]:
    """dill's by-value class (often a ``__main__`` model class): a placeholder *class*, never built.

    It must be a class: the pickle instantiates it with NEWOBJ, which needs a type.
    """
    module = namespace.get("__module__") if isinstance(namespace, dict) else None
    return _placeholder_class(str(module or "__main__"), str(name))


def _dill_create_array(f: Any, args: Any, state: Any, npdict: Any = None) -> Any:
    """dill's ``_create_array(f, args, state)``: a NumPy array, rebuilt only through NumPy's own reduce."""
    if f is not _np_reconstruct or not isinstance(args, tuple):
        return _placeholder_class("dill._dill", "_create_array")(f, args, state, npdict)
    array = _np_reconstruct(*args)
    array.__setstate__(state)
    return array


def _dill_create_namedtuple(name: Any, fieldnames: Any = (), modulename: Any = "__main__",
                            defaults: Any = None) -> type[Placeholder]:
    return _placeholder_class(str(modulename), str(name))


_REBUILDERS: set[Callable[..., Any]] = {
    _rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter, _rebuild_meta,
}
_SAFE_TYPES = (OrderedDict, dict, list, set, frozenset, tuple, defaultdict, Counter, deque, bytearray)

_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("collections", "defaultdict"): defaultdict,
    ("collections", "Counter"): Counter,
    ("collections", "deque"): deque,
    ("_codecs", "encode"): _codecs_encode,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("copy_reg", "_reconstructor"): _reconstructor,
    ("copyreg", "__newobj__"): _newobj,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): _torch_size,
    ("torch", "device"): _torch_device,
    ("torch.serialization", "_get_layout"): _get_layout,
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy.core.multiarray", "scalar"): _np_scalar,
    ("numpy._core.multiarray", "scalar"): _np_scalar,
    ("numpy", "dtype"): _NumpyDType,
    ("numpy", "ndarray"): _NumpyArrayBuilder,
    ("numpy.core.numeric", "_frombuffer"): _np_frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _np_frombuffer,
    ("dill._dill", "_create_type"): _dill_create_type,
    ("dill.dill", "_create_type"): _dill_create_type,
    ("dill._dill", "_create_namedtuple"): _dill_create_namedtuple,
    ("dill._dill", "_create_array"): _dill_create_array,
    ("dill.dill", "_create_array"): _dill_create_array,
    ("dill.dill", "_create_namedtuple"): _dill_create_namedtuple,
}


def _check_byte_source(name: str, args: tuple[Any, ...]) -> None:
    if args and not isinstance(args[0], (bytes, bytearray, str, list, tuple)):
        raise pickle.UnpicklingError(
            f"{name}() called on {type(args[0]).__name__}: pickles rebuild {name} from bytes or a string "
            "(a count would allocate that many bytes)"
        )


def _safe_bytes(*args: Any) -> bytes:
    """``bytes(...)`` as pickles call it (empty, or from a str and its encoding); never ``bytes(n)``."""
    _check_byte_source("bytes", args)
    return bytes(*args)


def _safe_bytearray(*args: Any) -> bytearray:
    """``bytearray(b'...')`` or ``bytearray('...', 'latin-1')``; never ``bytearray(n)``."""
    _check_byte_source("bytearray", args)
    return bytearray(*args)


def _safe_str(*args: Any) -> str:
    """``str(...)`` of text or a number; the text of a (possibly self-sharing) container is never built."""
    if args and not isinstance(args[0], (str, bytes, bytearray, int, float, complex, type(None))):
        raise pickle.UnpicklingError(f"str() called on {type(args[0]).__name__} is not rebuilt")
    return str(*args)


for _name in ("list", "dict", "set", "frozenset", "tuple", "complex", "slice", "int", "float", "bool"):
    _ALLOWED[("builtins", _name)] = getattr(builtins, _name)
_ALLOWED[("builtins", "bytes")] = _safe_bytes
_ALLOWED[("builtins", "bytearray")] = _safe_bytearray
_ALLOWED[("builtins", "str")] = _safe_str
# A range stays an inert record: list(range(10**9)) would be a billion-element list from 30 bytes.
_ALLOWED[("builtins", "range")] = _placeholder_class("builtins", "range")
for _name in ("list", "dict", "set", "frozenset", "tuple", "bytearray", "bytes", "complex",
              "slice", "range", "int", "float", "str", "bool"):
    _ALLOWED[("__builtin__", _name)] = _ALLOWED[("builtins", _name)]


def _torch_global(name: str) -> Any:
    if name in dtypes.BY_NAME:
        return DTypeRef(name)
    if name in dtypes.BY_STORAGE:
        return StorageType(name, dtypes.BY_STORAGE[name])
    if name == "UntypedStorage":
        return StorageType(name, None)
    return None


# --------------------------------------------------------------------- unpickler


from ..limits import DEFAULT_LIMITS, Limits  # noqa: E402 - defined in limits.py, importable from here as before


@dataclass
class UnpickleResult:
    obj: Any
    references: list[GlobalRef] = field(default_factory=list)


# Reads torch.save bytes nested in a pickle: (bytes, path=, where=, limits=) -> (object, globals).
# The format readers pass theirs in (formats/blob.py); this layer never imports them.
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
            self.persistent_load = persistent_load
        self._nested = 0

    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle API
        module, name = str(module), str(name)
        key = (module, name)
        if key not in self._seen:
            self._seen.add(key)
            self.references.append(GlobalRef(module, name, severity.severity(module, name), self.where))
        if key in _ALLOWED:
            return _ALLOWED[key]
        if key == ("torch.storage", "_load_from_bytes"):
            return self._load_from_bytes
        if module == "torch":
            found = _torch_global(name)
            if found is not None:
                return found
        if key in (("torch.storage", "UntypedStorage"), ("torch", "UntypedStorage")):
            return StorageType("UntypedStorage", None)
        return _placeholder_class(module, name)

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
) -> UnpickleResult:
    """Unpickle ``data`` without importing or calling anything it names."""
    if len(data) > limits.max_pickle_bytes:
        raise LimitExceeded(
            f"{where} is {len(data)} bytes, over the pickle limit of {limits.max_pickle_bytes} "
            "(raise it with --max-pickle-bytes)",
            path,
        )
    guard.check_bytes(data, where=where, path=path)
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
) -> UnpickleResult:
    """Unpickle one pickle from a binary stream, leaving it just past the STOP opcode.

    Formats that put several pickles and raw bytes one after another (legacy
    torch files) read each pickle this way; the caller bounds the stream.
    The pickle's bytes are checked (pickle_guard) before they are unpickled.
    """
    data = guard.read_one(stream, where=where, path=path, max_bytes=limits.max_pickle_bytes)
    unpickler = RestrictedUnpickler(io.BytesIO(data), where=where, persistent_load=persistent_load,
                                    path=path, limits=limits, read_blob=read_blob)
    return _run(unpickler, where, path)


def _run(unpickler: RestrictedUnpickler, where: str, path: str) -> UnpickleResult:
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
    return UnpickleResult(obj, unpickler.references)


def struct_error() -> type[Exception]:
    import struct

    return struct.error
