"""The shared vocabulary: immutable metadata records passed between layers.

Nothing here imports torch. A TensorMeta says everything about a tensor that
can be known without reading its bytes; a StorageRef says where the bytes are
for the few paths (stats, value diff, migrate) that need them.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Any

from . import dtypes
from .format_names import Format


class DataSource(ABC):
    """Something that can hand out the bytes of a storage by key."""

    path: str

    @abstractmethod
    def read(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes starting ``offset`` bytes into storage ``key``."""

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` with the bytes starting ``offset`` bytes into storage ``key``.

        Streaming readers reuse one buffer: a fresh multi-MB ``bytes`` per
        read costs page faults that double the time of reading it.
        """
        out[:] = self.read(key, offset, len(out))

    def close(self) -> None:  # noqa: B027 - a source that holds no handle has nothing to release
        """Release file handles; reading again reopens them."""



@lru_cache(maxsize=4096)
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


def _same_layout(shape: tuple[int, ...], stride: tuple[int, ...], want: tuple[int, ...]) -> bool:
    # Strides of size-1 (and size-0 tensors) dimensions do not matter, as in torch.
    if any(d == 0 for d in shape):
        return True
    return all(d == 1 or s == w for d, s, w in zip(shape, stride, want, strict=False))


def is_contiguous_layout(shape: tuple[int, ...], stride: tuple[int, ...] | None) -> bool:
    """Row-major, as torch's is_contiguous() says (None: contiguous by construction)."""
    if stride is None:
        return True
    want = contiguous_strides(shape)
    return stride == want or _same_layout(shape, stride, want)


def shapes_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """load_state_dict's rule: equal shapes, or a one-element 1-d tensor into a 0-d one."""
    return a == b or (b == () and len(a) == 1 and a[0] == 1)


# TensorMeta and StorageRef are __slots__ dataclasses with hand-written
# __init__s: readers make one of each per tensor (200,000 in some files), and
# a slots object is built 3x faster and is 4x smaller than a frozen
# dataclass (whose __init__ sets each field through object.__setattr__).
# They are not frozen for that reason; treat them as immutable (they hash
# by value, and readers share them between Checkpoints).


@dataclass(slots=True, init=False, unsafe_hash=True)
class StorageRef:
    """Where a tensor's storage bytes are; resolved only when data is read."""

    source: DataSource = field(compare=False, repr=False)
    key: str
    nbytes: int

    def __init__(self, source: DataSource, key: str, nbytes: int) -> None:
        self.source = source
        self.key = key
        self.nbytes = nbytes


_DTYPES = dtypes.BY_NAME


@dataclass(frozen=True)
class SubclassMeta:
    """A tensor subclass (torchao's Int8Tensor, ...): its class and the tensors that hold its data.

    The outer TensorMeta has the subclass's dtype and shape and no storage of
    its own; ``inner`` are the tensors its state holds, by attribute name
    (``qdata``, ``scale``, ``zero_point``), each with its storage. ``record``
    is the record as pickled, which the torch writer writes back unchanged.
    """

    qualname: str
    inner: tuple[tuple[str, TensorMeta], ...]
    layout: str = "torch.strided"
    record: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """inspect's note: the class and each inner tensor's dtype and shape."""
        parts = ", ".join(f"{name} {t.dtype} {list(t.shape)}" for name, t in self.inner[:8])
        if len(self.inner) > 8:  # torchao's hold two to six; a longer list is cut, never a megabyte of note
            parts += f", ... ({len(self.inner)} tensors)"
        return f"subclass {self.qualname}" + (f" ({parts})" if parts else "")


@dataclass(slots=True, init=False, unsafe_hash=True)
class TensorMeta:
    """A tensor described by metadata alone (no bytes are held).

    ``numel``, ``nbytes`` and ``storage_id`` are computed once, when it is
    built: every command asks for them (``nbytes`` is None for a dtype ckpt
    does not know).
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0  # in elements
    storage: StorageRef | None = field(default=None, compare=False)
    device: str = "cpu"
    numel: int = field(default=0, init=False, repr=False, compare=False)
    nbytes: int = field(default=0, init=False, repr=False, compare=False)
    storage_id: tuple[int, str] | None = field(default=None, init=False, repr=False, compare=False)
    # a quantized tensor's quantizer as torch pickles it: (qscheme name, scale, zero_point) or
    # (qscheme name, scales TensorMeta, zero_points TensorMeta, axis); None otherwise
    quantizer: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    # a tensor subclass (no storage of its own; its data are subclass.inner), None for a plain tensor
    subclass: SubclassMeta | None = field(default=None, repr=False)

    def __init__(
        self, key: str, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...] | None = None,
        storage_offset: int = 0, storage: StorageRef | None = None, device: str = "cpu",
        quantizer: tuple[Any, ...] | None = None, subclass: SubclassMeta | None = None,
    ) -> None:
        self.key = key
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage_offset = storage_offset
        self.storage = storage
        self.device = device
        try:
            numel = prod(shape)
        except TypeError:  # not a shape of numbers: readers reject these before building one
            numel = None
        self.numel = numel  # type: ignore[assignment]
        dt = _DTYPES.get(dtype)
        if dt is None or numel is None:
            self.nbytes = None  # type: ignore[assignment]
        else:  # inlined DType.nbytes for whole-byte dtypes: built once per tensor, 200,000 times in some files
            self.nbytes = numel * dt.itemsize if dt.per_byte == 1 else dt.nbytes(numel)
        self.storage_id = None if storage is None else (id(storage.source), storage.key)
        self.quantizer = quantizer
        self.subclass = subclass
        if subclass is not None and storage is None:  # a wrapper: its bytes are those of the tensors it holds
            self.nbytes = sum(t.nbytes or 0 for _, t in subclass.inner)

    @property
    def itemsize(self) -> int:
        return dtypes.lookup(self.dtype).itemsize

    def no_data(self) -> str:
        """Why this tensor has no bytes to read: saved on the meta device, or a subclass holding others."""
        sub = self.subclass
        if sub is not None:
            names = ", ".join(f"{self.key}.{n}" for n, _ in sub.inner) or "none"
            return (f"tensor {self.key!r} is a tensor subclass ({sub.qualname}) with no storage of its own; its "
                    f"data are the tensors it holds ({names})")
        return f"tensor {self.key!r} has no data (saved on the meta device?)"

    @property
    def is_floating(self) -> bool:
        return dtypes.lookup(self.dtype).is_floating

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous_layout(self.shape, self.stride)

    @property
    def strides(self) -> tuple[int, ...]:
        """The stride, with ``None`` (contiguous by construction) spelled out."""
        return self.stride if self.stride is not None else contiguous_strides(self.shape)

    @property
    def is_channels_last(self) -> bool:
        if self.stride is None or len(self.shape) != 4 or self.is_contiguous:
            return False
        _n, c, h, w = self.shape
        return _same_layout(self.shape, self.stride, (h * w * c, 1, w * c, c))

    @property
    def byte_span(self) -> tuple[int, int]:
        """Bytes [start, end) of the storage this view can touch."""
        dt = dtypes.lookup(self.dtype)
        start = dt.nbytes(self.storage_offset)
        numel = self.numel
        if numel == 0:
            return (start, start)
        if self.stride is None or self.stride == contiguous_strides(self.shape):
            return (start, start + dt.nbytes(numel))
        last = sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=False))
        return (start, dt.nbytes(self.storage_offset + last + 1))


def with_inner(tensors: Sequence[TensorMeta]) -> list[TensorMeta]:
    """``tensors`` with each tensor subclass that has no storage of its own replaced by the tensors it holds
    (``KEY.qdata``, ...): what a check that reads data reads."""
    if all(t.subclass is None for t in tensors):
        return list(tensors)
    out: list[TensorMeta] = []
    for t in tensors:
        if t.subclass is not None and t.storage is None:
            out.extend(m for _, m in t.subclass.inner)
        else:
            out.append(t)
    return out


@dataclass(frozen=True)
class GlobalRef:
    """A global (module.name) that a pickle in the input refers to."""

    module: str
    name: str
    severity: str  # "safe", "suspicious", "dangerous"
    where: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


class Deferred(ABC):
    """A non-tensor value a file keeps apart from its metadata (a DCP bytes item), left unread.

    Metadata paths (inspect, diff without --values, the gate's checks) show
    ``describe()`` and read nothing, so a DCP folder costs its ``.metadata``
    alone; data paths (migrate, diff --values) read the value with
    formats/dcp/deferred.py, as torch does when it loads the checkpoint.
    """

    kind: str  # what it is ("bytes item")
    nbytes: int  # its size where it is stored
    file: str  # the file holding it, relative to the checkpoint

    def describe(self) -> str:
        return f"<{self.kind}: {self.nbytes} bytes in {self.file}, not read>"

    @abstractmethod
    def load(self, opened: dict[str, Any]) -> tuple[Any, list[GlobalRef]] | None:
        """(value, globals its pickle names), reusing the byte sources in ``opened`` (file -> source);
        None where the file is absent (a metadata-only copy). Raises CkptError when it is unreadable."""

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return self.describe()


_MAX_DEFERRED_DEPTH = 64


def unread(tree: Any) -> list[tuple[str, Deferred]]:
    """(dotted path, value) of every deferred value in ``tree`` (metadata or a container), in order.

    Here, beside Deferred, so that inspect lists them without importing the DCP reader's package.
    """
    found: list[tuple[str, Deferred]] = []

    def walk(obj: Any, path: str, depth: int) -> None:
        if isinstance(obj, Deferred):
            found.append((path, obj))
        elif depth < _MAX_DEFERRED_DEPTH and isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}.{k}" if path else str(k), depth + 1)
        elif depth < _MAX_DEFERRED_DEPTH and isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}.{i}" if path else str(i), depth + 1)

    walk(tree, "", 0)
    return found


@dataclass(frozen=True)
class Candidate:
    """A place in a container that holds tensors, and whether it was chosen."""

    key: str  # dotted path; "" is the top level
    tensors: int
    chosen: bool


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the state_dict as metadata, plus everything around it.

    ``root`` is the container as the restricted unpickler built it (dicts,
    LazyTensors, inert placeholders); migrate uses it to keep metadata.
    """

    path: str
    format: Format
    tensors: tuple[TensorMeta, ...]
    layout: str = "state_dict"
    state_dict_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    framework: str | None = None
    candidates: tuple[Candidate, ...] = ()
    references: tuple[GlobalRef, ...] = ()
    warnings: tuple[str, ...] = ()
    root: Any = field(default=None, compare=False, repr=False)
    sources: tuple[DataSource, ...] = field(default=(), compare=False, repr=False)
    # What decides torch.load(weights_only=True) of the input, when known: a
    # pickles.torch_rules.inputs.WeightsOnlyInput, which this layer cannot name
    # (readers narrow it with isinstance).
    weights_only: object = field(default=None, compare=False, repr=False)

    def __iter__(self) -> Iterator[TensorMeta]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def by_key(self) -> dict[str, TensorMeta]:
        return {t.key: t for t in self.tensors}

    @property
    def keys(self) -> list[str]:
        return [t.key for t in self.tensors]

    @property
    def total_numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def total_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def dangerous(self) -> tuple[GlobalRef, ...]:
        return tuple(r for r in self.references if r.severity == "dangerous")

    def close(self) -> None:
        for source in self.sources:
            source.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_safe(obj: Any) -> Any:
    """Metadata as plain JSON: NaN/Inf as strings, unknown objects as their str()."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
