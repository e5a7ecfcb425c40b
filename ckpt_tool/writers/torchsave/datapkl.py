"""``data.pkl`` as ``torch.save`` writes it, produced without importing torch.

Tensors become ``torch._utils._rebuild_tensor_v2`` calls over persistent
ids ``('storage', torch.<X>Storage, key, 'cpu', numel)`` (``_rebuild_tensor_v3``
and ``torch.storage.UntypedStorage`` for dtypes without a legacy storage
class), exactly the shapes torch's own (and its weights_only) unpickler
accept. Globals are written by name, so nothing is imported to name them.

Plain containers and scalars take a fast path (a 200,000-tensor state_dict
pickles in about a second); placeholders for classes ckpt did not import and
NumPy scalars are written back exactly as the source pickled them
(writers/torchsave/inert.py); anything else falls back to the standard library's
pickler, which only happens for objects that --unsafe loaded.
"""
from __future__ import annotations

import pickle
import struct
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import dtypes
from ...errors import UnsafeContentError
from ...io import MemorySource
from ...model import StorageRef, TensorMeta, contiguous_strides
from ...pickles.unpickle import DTypeRef, LayoutRef, LazyTensor, NumpyArray, SubclassTensor
from ..base import OutTensor
from .inert import save_inert
from .ints import _int, _int_tuple
from .subclass import save_subclass

_P = pickle  # opcode constants
_pack_I = struct.Struct("<I").pack
_BY_NAME = dtypes.BY_NAME


@dataclass
class Storage:
    """One ``data/<key>`` record of the archive: a whole source storage or a cast copy."""

    key: str
    nbytes: int
    ref: StorageRef | None = None  # copy this source storage whole
    cast: OutTensor | None = None  # or write this tensor's converted bytes


class StorageTable:
    """Assigns archive keys to storages, keeping shared storages shared."""

    def __init__(self) -> None:
        self.storages: list[Storage] = []
        self._by_source: dict[object, tuple[Storage, str]] = {}
        self._by_cast: dict[object, Storage] = {}
        self.memory = MemorySource("<memory>")

    def _new(self, nbytes: int, **kw: Any) -> Storage:
        st = Storage(str(len(self.storages)), nbytes, **kw)
        self.storages.append(st)
        return st

    def place(self, t: OutTensor) -> tuple[Storage, int, tuple[int, ...]]:
        """(storage, element offset, stride) for ``t``."""
        s = t.source
        if s.storage is None:
            raise UnsafeContentError(f"tensor {s.key!r} holds no data (saved on the meta device)")
        if t.cast:
            vk = t.view_key()
            found = self._by_cast.get(vk) if vk is not None else None
            if found is None:
                found = self._new(t.nbytes, cast=t)
                if vk is not None:
                    self._by_cast[vk] = found
            return found, 0, contiguous_strides(t.shape)
        sid = (s.storage_id, s.dtype)
        entry = self._by_source.get(sid)
        if entry is None:
            itemsize = s.itemsize
            ref = s.storage
            if ref.nbytes % itemsize:
                ref = StorageRef(ref.source, ref.key, ref.nbytes - ref.nbytes % itemsize)
            storage = self._new(ref.nbytes, ref=ref)
            self._by_source[sid] = (storage, s.dtype)
        else:
            storage = entry[0]
        stride = s.stride if s.stride is not None else contiguous_strides(s.shape)
        return storage, s.storage_offset, stride


class _Global:
    """A global named by module and name, written without importing it."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __call__(self, *args: Any) -> Any:  # pickle requires reduce functions to be callable
        raise TypeError(f"{self.module}.{self.name} is a name for pickling only")


# the pure-Python pickler: its save() dispatch can be extended, the C one's cannot
if TYPE_CHECKING:
    class _PurePickler(pickle._Pickler):
        """The undocumented internals of pickle._Pickler that TorchPickler uses (typeshed omits them)."""

        memo: dict[int, tuple[int, object]]  # id(obj) -> (memo index, obj)

        def write(self, data: bytes) -> None: ...
        def get(self, i: int) -> bytes: ...
        def put(self, idx: int) -> bytes: ...
        def memoize(self, obj: object) -> None: ...
        def save(self, obj: object, save_persistent_id: bool = True) -> None: ...
else:
    _PurePickler = pickle._Pickler


class TorchPickler(_PurePickler):
    """The standard library's pure-Python pickler with torch's tensor encoding added."""

    def __init__(self, file: Any, table: StorageTable) -> None:
        super().__init__(file, protocol=2)
        self.table = table
        self._globals: dict[tuple[str, str], bytes] = {}  # global -> the opcode that fetches it again
        self._keepalive: list[Any] = []
        self._const: dict[str, bytes] = {}  # "storage", "cpu" -> the opcode that fetches them again

    # ---------------------------------------------------------------- helpers
    def _global(self, module: str, name: str) -> bytes:
        again = self._globals.get((module, name))
        if again is not None:
            return again
        marker = _Global(module, name)
        self._keepalive.append(marker)
        idx = len(self.memo)
        self.memo[id(marker)] = idx, marker
        self._globals[(module, name)] = self.get(idx)
        opcode: bytes = _P.GLOBAL + f"{module}\n{name}\n".encode() + self.put(idx)
        return opcode

    def _constant(self, s: str) -> bytes:
        """A string written once and fetched from the memo afterwards."""
        again = self._const.get(s)
        if again is not None:
            return again
        encoded = s.encode("utf-8")
        idx = len(self.memo)
        slot = object()  # a memo slot of its own: the same string object may be memoized by _str too
        self._keepalive.append(slot)
        self.memo[id(slot)] = idx, s
        self._const[s] = self.get(idx)
        opcode: bytes = _P.BINUNICODE + _pack_I(len(encoded)) + encoded + self.put(idx)
        return opcode

    def _str(self, s: str) -> None:
        found = self.memo.get(id(s))
        if found is not None:
            self.write(self.get(found[0]))
            return
        encoded = s.encode("utf-8", "surrogatepass")
        idx = len(self.memo)
        self.memo[id(s)] = idx, s
        self.write(_P.BINUNICODE + _pack_I(len(encoded)) + encoded + self.put(idx))

    def _mapping(self, obj: Any) -> None:
        """dict / OrderedDict as pickle writes them, without a save() round trip per item."""
        found = self.memo.get(id(obj))
        if found is not None:
            self.write(self.get(found[0]))
            return
        if type(obj) is dict:
            self.write(_P.EMPTY_DICT)
        else:
            self.write(self._global("collections", "OrderedDict") + _P.EMPTY_TUPLE + _P.REDUCE)
        self.memoize(obj)
        items = list(obj.items())
        save = self.save
        for start in range(0, len(items), 1000):
            batch = items[start:start + 1000]
            if len(batch) > 1:
                self.write(_P.MARK)
            for k, v in batch:
                save(k)
                save(v)
            self.write(_P.SETITEMS if len(batch) > 1 else _P.SETITEM)
        state = getattr(obj, "__dict__", None) if type(obj) is not dict else None
        if state:
            save(state)
            self.write(_P.BUILD)

    # ------------------------------------------------------------------- save
    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        t = type(obj)
        if t is OutTensor:
            sub = obj.source.subclass
            if sub is not None and isinstance(sub.record, SubclassTensor):
                self._subclass(sub.record)
            else:
                self._tensor(obj)
            return
        if t is str:
            self._str(obj)
            return
        if t is LayoutRef:  # torch.serialization._get_layout(name), as torch.save wrote it
            self.write(self._global("torch.serialization", "_get_layout"))
            self._str(str(obj))
            self.write(_P.TUPLE1 + _P.REDUCE)
            return
        if t is dict or t is OrderedDict:
            self._mapping(obj)
            return
        if t is LazyTensor or t is TensorMeta:
            meta = _as_meta(obj)
            self._tensor(OutTensor("", meta, meta.dtype), obj, requires_grad=getattr(obj, "requires_grad", False))
            return
        if t is _Global:
            self.write(self._global(obj.module, obj.name))
            return
        if t is DTypeRef:
            self.write(self._global("torch", obj.name))
            return
        if isinstance(obj, NumpyArray):
            self._numpy(obj)
            return
        if t is SubclassTensor:
            self._subclass(obj)
            return
        if save_inert(self, obj):
            return
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
            meta = self._real_tensor(obj)
            self._tensor(OutTensor("", meta, meta.dtype), obj, requires_grad=bool(obj.requires_grad))
            return
        super().save(obj, save_persistent_id)

    def _tensor(self, t: OutTensor, identity: Any = None, requires_grad: bool = False) -> None:
        ident = identity if identity is not None else t
        found = self.memo.get(id(ident))
        if found is not None:
            self.write(self.get(found[0]))
            return
        storage, offset, stride = self.table.place(t)
        dt = _BY_NAME.get(t.dtype) or dtypes.lookup(t.dtype)
        if t.source.quantizer is not None and not t.cast:
            self._qtensor(t, storage, offset, stride, dt, requires_grad)
            self.memoize(ident)
            return
        rebuild, args = self._tensor_call(t, storage, offset, stride, dt, requires_grad)
        self.write(rebuild + args + _P.REDUCE)
        self.memoize(ident)

    def _tensor_call(self, t: OutTensor, storage: Storage, offset: int, stride: tuple[int, ...], dt: dtypes.DType,
                     requires_grad: bool) -> tuple[bytes, bytes]:
        """The rebuild function, and its argument tuple (REDUCE not included)."""
        v3 = dt.storage is None
        g = self._global
        numel = storage.nbytes if v3 else storage.nbytes // dt.itemsize
        key = storage.key.encode("ascii")
        # _rebuild_tensor_v2((('storage', torch.<X>Storage, key, 'cpu', numel)), offset, size, stride,
        #                    requires_grad, OrderedDict()[, dtype]); the persistent id is not memoized
        rebuild = g("torch._utils", "_rebuild_tensor_v3" if v3 else "_rebuild_tensor_v2")
        return rebuild, b"".join((
            _P.MARK, _P.MARK,
            self._constant("storage"),
            g("torch.storage", "UntypedStorage") if v3 else g("torch", dt.storage),  # type: ignore[arg-type]
            _P.BINUNICODE, _pack_I(len(key)), key,
            self._constant("cpu"),
            _int(numel), _P.TUPLE, _P.BINPERSID,
            _int(offset), _int_tuple(tuple(t.shape)), _int_tuple(tuple(stride)),
            _P.NEWTRUE if requires_grad else _P.NEWFALSE,
            g("collections", "OrderedDict"), _P.EMPTY_TUPLE, _P.REDUCE,
            g("torch", dt.name) if v3 else b"", _P.TUPLE,
        ))

    def _qtensor(self, t: OutTensor, storage: Storage, offset: int, stride: tuple[int, ...], dt: dtypes.DType,
                 requires_grad: bool) -> None:
        """``torch._utils._rebuild_qtensor`` as torch.save writes it: the integer storage, then the
        quantizer as the source pickled it (scheme, scale and zero point, or per-channel tensors and axis)."""
        g = self._global
        key = storage.key.encode("ascii")
        self.write(b"".join((
            g("torch._utils", "_rebuild_qtensor"), _P.MARK, _P.MARK,
            self._constant("storage"), g("torch", dt.storage),  # type: ignore[arg-type]
            _P.BINUNICODE, _pack_I(len(key)), key, self._constant("cpu"),
            _int(storage.nbytes // dt.itemsize), _P.TUPLE, _P.BINPERSID,
            _int(offset), _int_tuple(tuple(t.shape)), _int_tuple(tuple(stride)),
        )))
        q = t.source.quantizer or ("per_tensor_affine",)
        self.write(_P.MARK + g("torch", str(q[0])))
        for part in q[1:]:
            if isinstance(part, TensorMeta):
                self._tensor(OutTensor("", part, part.dtype), part)
            else:
                self.save(part)
        self.write(_P.TUPLE)
        self.write((_P.NEWTRUE if requires_grad else _P.NEWFALSE)
                   + g("collections", "OrderedDict") + _P.EMPTY_TUPLE + _P.REDUCE + _P.TUPLE + _P.REDUCE)

    def _subclass(self, rec: SubclassTensor) -> None:
        save_subclass(self, rec)

    def base_call(self, base: LazyTensor, requires_grad: bool) -> tuple[bytes, bytes]:
        """A subclass's own storage-backed tensor: its rebuild function and argument tuple (writers/torchsave/
        subclass.py wraps them in ``_rebuild_from_type_v2``)."""
        meta = _as_meta(base)
        t = OutTensor("", meta, meta.dtype)
        storage, offset, stride = self.table.place(t)
        dt = _BY_NAME.get(t.dtype) or dtypes.lookup(t.dtype)
        return self._tensor_call(t, storage, offset, stride, dt, requires_grad)

    def _numpy(self, arr: NumpyArray) -> None:
        """Re-emit a NumPy array the way NumPy pickles it (metadata only; never a state_dict tensor)."""
        self.write(self._global(arr.module, "_reconstruct"))
        self.write(self._global("numpy", "ndarray"))
        self.write(_int_tuple((0,)))
        self.save(b"b")
        self.write(_P.TUPLE3 + _P.REDUCE)
        self.memoize(arr)
        self.write(_P.MARK + _int(1) + _int_tuple(tuple(arr.shape)))
        code = arr.type_string.lstrip("<>|=") or "u1"
        order = arr.type_string[:1] if arr.type_string[:1] in "<>|=" else "|"
        self.write(self._global("numpy", "dtype"))
        self._str(code)
        self.write(_P.NEWFALSE + _P.NEWTRUE + _P.TUPLE3 + _P.REDUCE)
        self.write(_P.MARK + _int(3))
        self._str(order)
        self.write(_P.NONE + _P.NONE + _P.NONE + _int(-1) + _int(-1) + _int(0) + _P.TUPLE + _P.BUILD)
        self.write(_P.NEWTRUE if arr.fortran else _P.NEWFALSE)
        self.save(arr.data)
        self.write(_P.TUPLE + _P.BUILD)

    def _real_tensor(self, x: Any) -> TensorMeta:
        """A real torch tensor (only reachable with --unsafe): its whole storage, kept shared."""
        storage = x.untyped_storage()
        key = f"real:{storage.data_ptr()}:{storage.nbytes()}:{x.dtype}"
        mem = self.table.memory
        if key not in mem.buffers:
            cpu = storage.cpu() if storage.device.type != "cpu" else storage
            mem.buffers[key] = bytes(cpu) if storage.nbytes() else b""
        name = str(x.dtype).replace("torch.", "")
        itemsize = dtypes.lookup(name).itemsize
        ref = StorageRef(mem, key, storage.nbytes() - storage.nbytes() % itemsize)
        return TensorMeta("", name, tuple(x.shape), tuple(x.stride()), x.storage_offset(), ref, "cpu")


def _as_meta(obj: LazyTensor | TensorMeta) -> TensorMeta:
    if isinstance(obj, TensorMeta):
        return obj
    st = obj.storage
    ref = st.ref if st is not None else None
    quantizer = None
    if obj.quantizer is not None:
        from ...formats.checkpoint import quantizer_meta

        quantizer = quantizer_meta("", obj.quantizer, _NO_MEMORY)
    return TensorMeta("", obj.dtype.name, obj.shape, obj.stride, obj.storage_offset, ref, obj.device, quantizer)


_NO_MEMORY = MemorySource("<quantizer>")  # quantizers hold tensors and numbers, never NumPy arrays


def as_meta(obj: LazyTensor | TensorMeta) -> TensorMeta:
    """A metadata tensor (optimizer state, ...) as a TensorMeta sharing its storage identity."""
    return _as_meta(obj)


def make_state_dict(template: Any, items: list[tuple[str, Any]]) -> Any:
    """A new state_dict of the template's mapping type (dict or OrderedDict)."""
    if type(template) is dict:
        return dict(items)
    return OrderedDict(items)
