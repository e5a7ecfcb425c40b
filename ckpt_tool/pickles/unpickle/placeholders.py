"""What the restricted unpickler builds instead of running anything: inert, lazy stand-ins.

LazyStorage and LazyTensor describe storages and tensors without reading
their bytes; NumpyArray, DTypeRef and StorageType record what NumPy and
torch objects a pickle named; every other global becomes a Placeholder
class that only records its arguments, state and items.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from ... import dtypes
from ...model import StorageRef


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


class _FunctionStandIn(type):
    """The metaclass of a class that stands in for a torch *function* (LazyTensor: ``_rebuild_tensor_v2``).

    BUILD on a function sets its attributes (``torch.load(weights_only=False)``
    does, without failing); on a class the unpickler would fail instead. Here
    the class takes the state as the function would, keeping it where the
    unpickler's check (``RestrictedUnpickler.restore_stand_ins``) finds it,
    reports it (dangerous: module state changed) and removes it.
    """

    def __setstate__(cls, state: Any) -> None:
        type.__setattr__(cls, "_ckpt_build_state", state)


class LazyTensor(metaclass=_FunctionStandIn):
    """What ``torch._utils._rebuild_tensor_v2`` would build, as metadata.

    The constructor takes ``_rebuild_tensor_v2``'s arguments, so the
    unpickler builds one per tensor with a single call (200,000 in some
    files); ``meta`` builds the storage-less tensors of other rebuilds.
    """

    __slots__ = (
        "dtype",
        "is_parameter",
        "quantizer",
        "requires_grad",
        "shape",
        "storage",
        "storage_offset",
        "stride",
        "subclass",
    )

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
        # _rebuild_qtensor's quantizer_params as pickled: (qscheme, scale, zero_point) or
        # (qscheme, scales, zero_points, axis); None for a tensor that is not quantized
        self.quantizer: tuple[Any, ...] | None = None

    @classmethod
    def meta(cls, dtype: dtypes.DType, shape: tuple[int, ...], stride: tuple[int, ...],
             requires_grad: bool = False) -> LazyTensor:
        """A tensor without a storage (saved on the meta device)."""
        t = cls.__new__(cls)
        t.storage, t.storage_offset, t.shape, t.stride, t.dtype = None, 0, shape, stride, dtype
        t.requires_grad, t.is_parameter, t.subclass, t.quantizer = requires_grad, False, None, None
        return t

    @property
    def device(self) -> str:
        if self.storage is None:
            return "meta"
        return self.storage.location

    def __repr__(self) -> str:
        return f"LazyTensor({self.dtype.name}, {list(self.shape)})"


class SubclassTensor:
    """A tensor subclass as torch's own rebuild functions describe it, kept exactly as pickled.

    ``torch.Tensor.__reduce_ex__`` of a wrapper subclass (torchao's Int8Tensor,
    Float8Tensor, IntxUnpackedToInt8Tensor, ...) pickles
    ``_rebuild_from_type_v2(_rebuild_wrapper_subclass, T, (T, dtype, size, stride,
    offset, layout, device, requires_grad), state)``: the outer tensor has no
    storage; its data are the tensors its ``state`` (the instance ``__dict__``)
    holds, by attribute (``qdata``, ``scale``, ``zero_point``). Nothing of T is
    imported or run: the class is a placeholder, the state is what the
    restricted unpickler built, and migrate writes the same call back.

    A subclass that keeps its data in an ordinary storage (``as_subclass``, or a
    plain tensor with attributes) pickles ``_rebuild_from_type_v2(_rebuild_tensor_v2,
    T, args, state)`` instead: ``base`` is that tensor, and the rest describes it.
    """

    __slots__ = ("base", "cls", "device", "dtype", "layout", "requires_grad", "shape", "state", "storage_offset",
                 "stride")

    def __init__(self, cls: type[Placeholder], dtype: dtypes.DType, shape: tuple[int, ...], stride: tuple[int, ...],
                 storage_offset: int, layout: str, device: str, requires_grad: bool, state: Any) -> None:
        self.cls = cls
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage_offset = storage_offset
        self.layout = layout
        self.device = device
        self.requires_grad = requires_grad
        self.state = state
        self.base: LazyTensor | None = None  # the storage-backed tensor of a plain subclass

    @classmethod
    def of_tensor(cls, new_type: type[Placeholder], base: LazyTensor, state: Any) -> SubclassTensor:
        """``_rebuild_from_type_v2(_rebuild_tensor_v2, T, args, state)``: ``base`` rebuilt, as class T."""
        obj = cls(new_type, base.dtype, base.shape, base.stride, base.storage_offset, "torch.strided", base.device,
                  base.requires_grad, state)
        obj.base = base
        return obj

    @property
    def qualname(self) -> str:
        return f"{self.cls._ckpt_module}.{self.cls._ckpt_name}"

    def inner(self, depth: int = 0) -> list[tuple[str, Any]]:
        """The tensors the state holds, by attribute name (a nested subclass's under ``name.inner``)."""
        out: list[tuple[str, Any]] = []
        if depth > 8:  # torchao nests one level (a packed layout in a wrapper); a deeper chain is not data
            return out
        state = self.state
        attrs = state[0] if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict) else state
        if not isinstance(attrs, dict):
            return out
        for name, value in attrs.items():
            if isinstance(value, LazyTensor):
                out.append((str(name), value))
            elif isinstance(value, SubclassTensor):
                out.extend((f"{name}.{sub}", t) for sub, t in value.inner(depth + 1))
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, LazyTensor) for v in value):
                out.extend((f"{name}.{i}", v) for i, v in enumerate(value))
        return out

    def __repr__(self) -> str:
        return f"SubclassTensor({self.qualname}, {self.dtype.name}, {list(self.shape)})"


@dataclass
class NumpyArray:
    """A NumPy array from a pickle: dtype, shape and its bytes (inline in the pickle)."""

    dtype: dtypes.DType | None = None
    shape: tuple[int, ...] = ()
    fortran: bool = False
    data: bytes = b""
    type_string: str = ""
    module: str = "numpy.core.multiarray"  # where the pickle found ``_reconstruct`` (migrate writes the same)
    items: tuple[Any, ...] = ()  # an object array's items, unpickled (restricted) like any others


class NumpyScalar:
    """A NumPy scalar read from a pickle (``numpy.core.multiarray.scalar(dtype, bytes)``), as a Python number.

    The subclasses below are floats and ints in every way, and remember how
    NumPy pickled them (``numpy``: the module ``scalar`` came from, the dtype
    record, the raw bytes), so migrate writes them back as NumPy scalars.
    """

    numpy: tuple[str, Any, bytes]

    def python(self) -> Any:
        """The plain Python number (what --sanitize writes)."""
        raise NotImplementedError

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("a NumPy scalar read by ckpt is pickled by ckpt's own writer")


class NumpyFloat(NumpyScalar, float):
    def python(self) -> float:
        return float(self)


class NumpyInt(NumpyScalar, int):
    def python(self) -> int:
        return int(self)


class NumpyBool(NumpyScalar, int):
    """``numpy.bool_``: an int (bool cannot be subclassed) that says True/False."""

    def python(self) -> bool:
        return bool(self)

    def __repr__(self) -> str:
        return repr(bool(self))

    __str__ = __repr__


def numpy_scalar(value: Any, module: str, dt: Any, raw: bytes) -> Any:
    """``value`` (a Python number) as the NumpyScalar that remembers its origin."""
    cls = NumpyBool if isinstance(value, bool) else NumpyInt if isinstance(value, int) else NumpyFloat
    out = cls(value)
    out.numpy = (module, dt, raw)
    return out


@dataclass
class DTypeRef:
    """``torch.float32`` and friends, named by the pickle."""

    name: str


class LayoutRef(str):
    """``torch.serialization._get_layout("torch.sparse_coo")``: the layout's name, which the torch writer writes
    back as that call (a plain string would reach torch's rebuilds as a str, which they refuse)."""

    __slots__ = ()


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
        d["_ckpt_via"] = "new"  # cls.__new__(cls, *args): NEWOBJ; "call" when __init__ follows (REDUCE)
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_ckpt_via"] = "call"

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
        return placeholder_class("<call>", name)(*args, **kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"placeholder for {self.qualname} cannot be pickled as the real object")

    @property
    def qualname(self) -> str:
        return f"{self._ckpt_module}.{self._ckpt_name}"

    @property
    def args(self) -> tuple[Any, ...]:
        args: tuple[Any, ...] = self.__dict__["_ckpt_args"]
        return args

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


def placeholder_class(module: str, name: str) -> type[Placeholder]:
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
