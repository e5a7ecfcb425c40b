"""The shared vocabulary: frozen metadata records passed between layers.

Nothing here imports torch. A TensorMeta says everything about a tensor that
can be known without reading its bytes; a StorageRef says where the bytes are
for the few paths (stats, value diff, migrate) that need them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Mapping, TypeVar, overload

from . import dtypes

if TYPE_CHECKING:
    from .source import DataSource


_T = TypeVar("_T")


class cached(Generic[_T]):
    """A derived attribute computed once per object, on first use.

    functools.cached_property takes a lock on every first access (Python
    3.11), which costs more than the value for 200,000 tensors. The value is
    stored in the instance ``__dict__`` (so frozen dataclasses keep working)
    and shadows this non-data descriptor afterwards.
    """

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


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
    return all(d == 1 or s == w for d, s, w in zip(shape, stride, want))


@dataclass(frozen=True)
class StorageRef:
    """Where a tensor's storage bytes are; resolved only when data is read."""

    source: DataSource = field(compare=False, repr=False)
    key: str
    nbytes: int

    def __init__(self, source: DataSource, key: str, nbytes: int) -> None:
        # Hand-written for speed, like TensorMeta's: one per storage.
        self.__dict__.update(source=source, key=key, nbytes=nbytes)


@dataclass(frozen=True)
class TensorMeta:
    """A tensor described by metadata alone (no bytes are held)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0  # in elements
    storage: StorageRef | None = field(default=None, compare=False)
    device: str = "cpu"

    def __init__(
        self, key: str, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...] | None = None,
        storage_offset: int = 0, storage: StorageRef | None = None, device: str = "cpu",
    ) -> None:
        # Hand-written: a frozen dataclass's generated __init__ costs 2x more,
        # and readers build one TensorMeta per tensor (200,000 in some files).
        dt = dtypes.BY_NAME.get(dtype)
        if dt is not None and type(shape) is tuple:
            # numel/itemsize/nbytes/storage_id up front, in the same update: every command
            # asks for them, and this costs less than four cached-descriptor calls later
            try:
                numel = prod(shape)
            except TypeError:
                numel = None  # not a shape of numbers: left to the properties (and their errors)
            if numel is not None:
                self.__dict__.update(
                    key=key, dtype=dtype, shape=shape, stride=stride, storage_offset=storage_offset,
                    storage=storage, device=device, numel=numel, itemsize=dt.itemsize, nbytes=numel * dt.itemsize,
                    storage_id=None if storage is None else (id(storage.source), storage.key),
                )
                return
        self.__dict__.update(key=key, dtype=dtype, shape=shape, stride=stride,
                             storage_offset=storage_offset, storage=storage, device=device)

    # Derived values are cached on first use: renderers and checks ask for
    # them several times per tensor.
    @cached
    def numel(self) -> int:
        return prod(self.shape)

    @cached
    def itemsize(self) -> int:
        return dtypes.lookup(self.dtype).itemsize

    @cached
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def is_floating(self) -> bool:
        return dtypes.lookup(self.dtype).is_floating

    @cached
    def is_contiguous(self) -> bool:
        if self.stride is None:
            return True
        want = contiguous_strides(self.shape)
        return self.stride == want or _same_layout(self.shape, self.stride, want)

    @property
    def strides(self) -> tuple[int, ...]:
        """The stride, with ``None`` (contiguous by construction) spelled out."""
        return self.stride if self.stride is not None else contiguous_strides(self.shape)

    @property
    def is_channels_last(self) -> bool:
        if self.stride is None or len(self.shape) != 4 or self.is_contiguous:
            return False
        n, c, h, w = self.shape
        return _same_layout(self.shape, self.stride, (h * w * c, 1, w * c, c))

    @cached
    def storage_id(self) -> tuple[int, str] | None:
        """Identity of the underlying storage, to find tensors that share memory."""
        if self.storage is None:
            return None
        return (id(self.storage.source), self.storage.key)

    @property
    def byte_span(self) -> tuple[int, int]:
        """Bytes [start, end) of the storage this view can touch."""
        itemsize = self.itemsize
        start = self.storage_offset * itemsize
        numel = self.numel
        if numel == 0:
            return (start, start)
        if self.stride is None or self.stride == contiguous_strides(self.shape):
            return (start, start + numel * itemsize)
        last = sum((d - 1) * s for d, s in zip(self.shape, self.stride))
        return (start, start + (last + 1) * itemsize)


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
    format: str
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
