"""ckpt's own inert re-implementations of the globals a pickle may name, and the allowlist.

``ALLOWED`` maps (module, name) to what the restricted unpickler hands the
pickle instead of importing it: tensor rebuilds that produce LazyTensors,
NumPy arrays kept as bytes, dill's by-value classes as placeholder classes,
plain containers, and ``bytes``/``str`` that cannot be made to allocate.
"""
from __future__ import annotations

import builtins
import codecs
import pickle
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

from ... import dtypes
from ..inert import is_inert
from .placeholders import (
    DTypeRef,
    LayoutRef,
    LazyStorage,
    LazyTensor,
    NumpyArray,
    Placeholder,
    StorageType,
    SubclassTensor,
    numpy_scalar,
    placeholder_class,
)
from .wrappers import distributed_tensor, wrapper_subclass

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


def _rebuild_qtensor(storage: Any, storage_offset: int, size: Any, stride: Any, quantizer_params: Any,
                     requires_grad: Any = False, backward_hooks: Any = None) -> LazyTensor:
    """A quantized tensor: its integer data as metadata, its quantizer kept as pickled (migrate writes it back)."""
    if not isinstance(storage, LazyStorage) or not storage.dtype.is_quantized:
        raise pickle.UnpicklingError("a quantized tensor rebuilt from a storage that is not quantized")
    if not isinstance(quantizer_params, tuple) or not quantizer_params or not isinstance(quantizer_params[0], QScheme):
        raise pickle.UnpicklingError("a quantized tensor without a known quantization scheme")
    t = LazyTensor(storage, int(storage_offset), tuple(size), tuple(stride), requires_grad)
    t.quantizer = quantizer_params
    return t


class QScheme(str):
    """``torch.per_tensor_affine`` and its kin: a name, nothing to run."""


QSCHEMES = frozenset(["per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
                      "per_channel_affine_float_qparams"])


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
    dist = distributed_tensor(func, new_type, args, state)
    if dist is not None:
        return dist
    wrapped = wrapper_subclass(func, new_type, args, state)
    if wrapped is not None:
        return wrapped
    if func not in _REBUILDERS:
        if isinstance(func, type) and issubclass(func, Placeholder) and is_inert(func._ckpt_module, func._ckpt_name):
            return func(*args)  # a jagged nested tensor (_rebuild_njt): a record of its values and offsets
        raise pickle.UnpicklingError("tensor subclass rebuilt by an unknown function")
    result = func(*args)
    if isinstance(result, LazyTensor) and isinstance(new_type, type) and issubclass(new_type, Placeholder) \
            and result.quantizer is None and not result.is_parameter \
            and (new_type._ckpt_module, new_type._ckpt_name) != ("torch", "Tensor"):
        # a subclass over an ordinary storage (as_subclass): kept with its class and state, so that it is never
        # written back as a plain tensor in silence. A plain torch.Tensor carrying attributes (DeepSpeed ZeRO-3's
        # flat groups) stays a tensor, as every reader expects it.
        return SubclassTensor.of_tensor(new_type, result, state)
    return result


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """The older ``_rebuild_from_type(func, type, args, dict)``: ``func(*args).as_subclass(type)`` with its
    ``__dict__`` set, what ``_rebuild_from_type_v2`` does for a subclass over its own storage (migrate writes
    it back as that)."""
    if func not in _REBUILDERS:
        raise pickle.UnpicklingError("tensor subclass rebuilt by an unknown function")
    return _rebuild_from_type_v2(func, new_type, args, state)


def _getattr_from(module: str) -> Callable[..., Any]:
    """``getattr(Outer, "Inner")``, how protocol 2 names a nested class (``ShardedTensor.ProcessGroupState``):
    the placeholder class ``Outer.Inner``, nothing looked up. Any other getattr stays a record of the call.
    The walk and the severity table still judge getattr itself as dangerous (it is, in general)."""
    def nested_class(obj: Any = None, name: Any = None, *default: Any) -> Any:
        if isinstance(obj, type) and issubclass(obj, Placeholder) and not default and isinstance(name, str) \
                and name.isidentifier() and name[:1].isupper():
            return placeholder_class(obj._ckpt_module, f"{obj._ckpt_name}.{name}")
        return placeholder_class(module, "getattr")(obj, name, *default)

    return nested_class


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if not isinstance(obj, str) or codecs.lookup(encoding).name not in ("latin-1", "iso8859-1", "utf-8"):
        raise pickle.UnpicklingError("_codecs.encode used for something other than bytes")
    return obj.encode(encoding, errors)


def _reconstructor(cls: Any, base: Any, state: Any) -> Any:
    if isinstance(cls, type) and issubclass(cls, Placeholder):
        obj = cls()
        obj.__dict__["_ckpt_via"] = ("copyreg._reconstructor", base, state)  # written back the same way
        return obj
    if cls in (OrderedDict, dict, list, set):
        return cls() if state is None else cls(state)
    raise pickle.UnpicklingError("copyreg._reconstructor of a class ckpt does not rebuild")


def _newobj(cls: Any, *args: Any) -> Any:
    if isinstance(cls, type) and (issubclass(cls, Placeholder) or cls in _SAFE_TYPES):
        return cls.__new__(cls, *args)  # type: ignore[type-var,arg-type]  # one of the classes above
    raise pickle.UnpicklingError("copyreg.__newobj__ of a class ckpt does not rebuild")


def _torch_size(dims: Any = ()) -> tuple[int, ...]:
    return tuple(int(d) for d in dims)


def _torch_device(spec: Any, index: Any = None) -> str:
    spec = str(spec)
    return f"{spec}:{index}" if index is not None and ":" not in spec else spec


def _get_layout(name: Any) -> LayoutRef:
    return LayoutRef(str(name))


class _NumpyDType:
    """``numpy.dtype('f4', False, True)`` + BUILD state, without NumPy (both kept, to be written back)."""

    def __init__(self, code: Any = "", align: Any = False, copy: Any = True) -> None:
        self.code = str(code)
        self.order = "|"
        self.args = (code, align, copy)
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state
        if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str):
            self.order = state[1]

    def resolve(self) -> dtypes.DType | None:
        order = "<" if self.order in ("<", "=", "|") else self.order
        if order == ">":
            return None  # big-endian arrays are listed as unsupported rather than misread
        return dtypes.BY_NUMPY.get(self.code) or dtypes.BY_NUMPY.get("<" + self.code.lstrip("<|="))


NumpyDType = _NumpyDType  # the record migrate writes back (writers/torchsave/inert.py)


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
            self.items = tuple(raw)

    @staticmethod
    def order_code(dt: _NumpyDType) -> str:
        return dt.order + dt.code


def _np_reconstruct_from(module: str) -> Callable[..., NumpyArray]:
    def reconstruct(cls: Any, shape: Any, typecode: Any) -> NumpyArray:
        arr = _NumpyArrayBuilder()
        arr.module = module
        return arr

    _RECONSTRUCTS.add(reconstruct)
    return reconstruct


_RECONSTRUCTS: set[Callable[..., NumpyArray]] = set()


def _np_scalar(dt: Any, data: Any = None, module: str = "numpy.core.multiarray") -> Any:
    import struct

    resolved = dt.resolve() if isinstance(dt, _NumpyDType) else None
    if resolved is None or not isinstance(data, (bytes, bytearray)):
        return placeholder_class(module, "scalar")(dt, data)
    fmt = {"float64": "<d", "float32": "<f", "float16": "<e", "int64": "<q", "int32": "<i",
           "int16": "<h", "int8": "<b", "uint8": "<B", "uint16": "<H", "uint32": "<I",
           "uint64": "<Q", "bool": "<?"}.get(resolved.name)
    if fmt is None or struct.calcsize(fmt) != len(data):
        return placeholder_class(module, "scalar")(dt, data)
    return numpy_scalar(struct.unpack(fmt, bytes(data))[0], module, dt, bytes(data))


def _np_scalar_from(module: str) -> Callable[..., Any]:
    def scalar(dt: Any, data: Any = None) -> Any:
        return _np_scalar(dt, data, module)

    return scalar


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
    return placeholder_class(str(module or "__main__"), str(name))


def _dill_create_array(f: Any, args: Any, state: Any, npdict: Any = None) -> Any:
    """dill's ``_create_array(f, args, state)``: a NumPy array, rebuilt only through NumPy's own reduce."""
    if f not in _RECONSTRUCTS or not isinstance(args, tuple):
        return placeholder_class("dill._dill", "_create_array")(f, args, state, npdict)
    array = f(*args)
    array.__setstate__(state)
    return array


def _dill_create_namedtuple(name: Any, fieldnames: Any = (), modulename: Any = "__main__",
                            defaults: Any = None) -> type[Placeholder]:
    return placeholder_class(str(modulename), str(name))


_REBUILDERS: set[Callable[..., Any]] = {
    _rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter, _rebuild_meta,
}
_SAFE_TYPES = (OrderedDict, dict, list, set, frozenset, tuple, defaultdict, Counter, deque, bytearray)

ALLOWED: dict[tuple[str, str], Any] = {
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
    ("torch._utils", "_rebuild_qtensor"): _rebuild_qtensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._utils", "_rebuild_meta_tensor_no_storage"): _rebuild_meta,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch._tensor", "_rebuild_from_type"): _rebuild_from_type,
    ("torch", "Size"): _torch_size,
    ("torch", "device"): _torch_device,
    ("torch.serialization", "_get_layout"): _get_layout,
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct_from("numpy.core.multiarray"),
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct_from("numpy._core.multiarray"),
    ("numpy.core.multiarray", "scalar"): _np_scalar_from("numpy.core.multiarray"),
    ("numpy._core.multiarray", "scalar"): _np_scalar_from("numpy._core.multiarray"),
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
    ALLOWED[("builtins", _name)] = getattr(builtins, _name)
ALLOWED[("builtins", "bytes")] = _safe_bytes
ALLOWED[("builtins", "bytearray")] = _safe_bytearray
ALLOWED[("builtins", "str")] = _safe_str
ALLOWED[("builtins", "getattr")] = _getattr_from("builtins")
ALLOWED[("__builtin__", "getattr")] = _getattr_from("__builtin__")
# A range stays an inert record: list(range(10**9)) would be a billion-element list from 30 bytes.
ALLOWED[("builtins", "range")] = placeholder_class("builtins", "range")
for _name in ("list", "dict", "set", "frozenset", "tuple", "bytearray", "bytes", "complex",
              "slice", "range", "int", "float", "str", "bool"):
    ALLOWED[("__builtin__", _name)] = ALLOWED[("builtins", _name)]


def torch_global(name: str) -> Any:
    if name in dtypes.BY_NAME:
        return DTypeRef(name)
    if name in dtypes.BY_STORAGE:
        return StorageType(name, dtypes.BY_STORAGE[name])
    if name == "UntypedStorage":
        return StorageType(name, None)
    if name in QSCHEMES:
        return QScheme(name)
    return None
