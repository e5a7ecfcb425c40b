"""``migrate --sanitize``: metadata rewritten into types ``torch.load(weights_only=True)`` accepts.

What a training checkpoint holds besides its tensors, and what it becomes:

* ``argparse.Namespace``           -> a dict of its attributes
* NumPy scalars                    -> Python numbers
* NumPy arrays                     -> tensors (same dtype, shape and bytes)
* enum members (a class built from one plain value, no state) -> that value
* OmegaConf ``DictConfig``/``ListConfig`` -> plain dicts and lists
* any other object read as a placeholder -> a dict of its state with
  ``"__class__": "module.Name"`` (and ``__args__``/``__items__`` when it had them)
* containers torch's allowlist lacks (defaultdict, deque, frozenset, slice)
  -> dict, list, set or list, dict; a NumPy dtype or a class -> its name

Tensors, dicts, OrderedDicts (with their ``_metadata``), lists, tuples,
Counters, strings, bytes and numbers stay as they are. Each conversion is
listed ("args: argparse.Namespace -> dict"). Nothing is imported: the
placeholders already hold everything that is written.
"""
from __future__ import annotations

import math
import sys
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Mapping
from typing import Any

from ...io import MemorySource
from ...model import StorageRef, TensorMeta, contiguous_strides
from ...pickles.unpickle import DTypeRef, LazyTensor, NumpyArray, NumpyDType, NumpyScalar, Placeholder
from ..base import OutTensor

_MAX_DEPTH = 200
_PLAIN = (str, bytes, bytearray, bool, int, float, complex, type(None))


class Sanitizer:
    """One pass over a container tree; ``conversions`` says what changed where."""

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed  # torch's weights_only allowlist of the torch the output is for
        self.conversions: list[str] = []
        self.memory = MemorySource("<sanitized NumPy arrays>")

    def note(self, where: str, what: str) -> None:
        if len(self.conversions) < 1000:
            self.conversions.append(f"{where or '<top>'}: {what}")

    def __call__(self, obj: Any, where: str = "", depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError(f"{where}: nested too deeply to sanitize")
        t = type(obj)
        if t in _PLAIN or t is OutTensor or t is LazyTensor or t is TensorMeta or t is DTypeRef:
            if t is complex and "builtins.complex" not in self.allowed:
                self.note(where, "complex -> [real, imag]")
                return [obj.real, obj.imag]
            return obj
        if isinstance(obj, NumpyScalar):
            self.note(where, f"{_numpy_name(obj.numpy[1])} -> {type(obj.python()).__name__}")
            return obj.python()
        if isinstance(obj, NumpyArray):
            return self.array(obj, where)
        if isinstance(obj, Placeholder):
            return self.placeholder(obj, where, depth)
        if isinstance(obj, type) and issubclass(obj, Placeholder):
            name = f"{obj._ckpt_module}.{obj._ckpt_name}"
            self.note(where, f"the class {name} -> its name")
            return name
        if isinstance(obj, NumpyDType):
            self.note(where, f"numpy.dtype({obj.code!r}) -> its name")
            return obj.order + obj.code if obj.order in "<>" else obj.code
        return self.container(obj, where, depth)

    def sub(self, where: str, key: Any) -> str:
        return f"{where}.{key}" if where else str(key)

    def container(self, obj: Any, where: str, depth: int) -> Any:
        d = depth + 1
        if isinstance(obj, defaultdict):
            self.note(where, "collections.defaultdict -> dict")
            return {k: self(v, self.sub(where, k), d) for k, v in obj.items()}
        if isinstance(obj, OrderedDict) or type(obj) is Counter:
            new = type(obj)((k, self(v, self.sub(where, k), d)) for k, v in obj.items())
            state = getattr(obj, "__dict__", None)
            if state:
                new.__dict__.update({k: self(v, self.sub(where, k), d) for k, v in state.items()})
            return new
        if isinstance(obj, Mapping):
            return {k: self(v, self.sub(where, k), d) for k, v in obj.items()}
        if isinstance(obj, tuple):
            return tuple(self(v, self.sub(where, i), d) for i, v in enumerate(obj))
        if isinstance(obj, (list, deque)):
            if type(obj) is deque:
                self.note(where, "collections.deque -> list")
            return [self(v, self.sub(where, i), d) for i, v in enumerate(obj)]
        if isinstance(obj, (set, frozenset)):
            items = [self(v, where, d) for v in obj]
            if type(obj) is set and "builtins.set" in self.allowed:
                return set(items)
            to = "set" if "builtins.set" in self.allowed else "list"
            self.note(where, f"{type(obj).__name__} -> {to}")
            return set(items) if to == "set" else items
        if isinstance(obj, slice):
            self.note(where, "slice -> dict")
            return {"__class__": "builtins.slice", "__args__": [obj.start, obj.stop, obj.step]}
        return self.real_object(obj, where, depth)

    def real_object(self, obj: Any, where: str, depth: int) -> Any:
        """An object --unsafe built for real: an enum's value, a NumPy value's item, else its __dict__."""
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return obj  # a real tensor (--unsafe): written as a tensor
        cls = type(obj)
        name = f"{cls.__module__}.{cls.__qualname__}"
        value = getattr(obj, "value", None) if hasattr(cls, "__members__") else None
        if value is not None:
            self.note(where, f"{name} -> its value")
            return self(value, where, depth + 1)
        if hasattr(obj, "item") and cls.__module__ == "numpy":
            self.note(where, f"{name} -> {type(obj.item()).__name__}")
            return obj.item()
        if hasattr(obj, "tolist") and cls.__module__ == "numpy":
            self.note(where, f"{name} -> list")
            return self(obj.tolist(), where, depth + 1)
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            self.note(where, f"{name} -> dict")
            plain = {str(k): self(v, self.sub(where, k), depth + 1) for k, v in state.items()}
            return plain if name == "argparse.Namespace" else {"__class__": name, **plain}
        self.note(where, f"{name} -> its repr")
        return repr(obj)

    def array(self, arr: NumpyArray, where: str) -> Any:
        dt = arr.dtype
        if dt is None or (not arr.data and math.prod(arr.shape) > 0):
            self.note(where, f"numpy.ndarray ({arr.type_string or '?'}) -> dict (its items are not kept)")
            return {"__class__": "numpy.ndarray", "dtype": arr.type_string, "shape": list(arr.shape)}
        key = self.memory.add(arr.data)
        shape = tuple(arr.shape)
        stride = contiguous_strides(shape[::-1])[::-1] if arr.fortran else contiguous_strides(shape)
        self.note(where, f"numpy.ndarray {arr.type_string} {list(shape)} -> tensor {dt.name}")
        return TensorMeta("", dt.name, shape, stride, 0, StorageRef(self.memory, key, len(arr.data)), "cpu")

    def placeholder(self, obj: Placeholder, where: str, depth: int) -> Any:
        d = depth + 1
        name = obj.qualname
        raw = obj.__dict__
        state, items, setitems = raw["_ckpt_state"], raw["_ckpt_items"], raw["_ckpt_setitems"]
        attrs = obj.attributes
        if name == "argparse.Namespace":
            self.note(where, "argparse.Namespace -> dict")
            return {str(k): self(v, self.sub(where, k), d) for k, v in attrs.items()}
        if obj._ckpt_module.split(".")[0] == "omegaconf":
            self.note(where, f"{name} -> plain container")
            return self.omegaconf(obj, where, d)
        args = obj.args
        if (raw.get("_ckpt_via") == "call" and len(args) == 1 and type(args[0]) in _PLAIN
                and state is None and not items and not setitems and not raw["_ckpt_kwargs"]):
            self.note(where, f"{name} -> its value {args[0]!r} (an enum member, or a class built from one value)")
            return args[0]
        self.note(where, f"{name} -> dict with \"__class__\"")
        out: dict[str, Any] = {"__class__": name}
        if setitems and not attrs:
            out.update({str(k): self(v, self.sub(where, k), d) for k, v in setitems.items()})
        elif setitems:
            out["__items__"] = {str(k): self(v, self.sub(where, k), d) for k, v in setitems.items()}
        out.update({str(k): self(v, self.sub(where, k), d) for k, v in attrs.items() if str(k) != "__class__"})
        if state is not None and not attrs:
            out["__state__"] = self(state, self.sub(where, "__state__"), d)
        if args:
            out["__args__"] = [self(v, self.sub(where, i), d) for i, v in enumerate(args)]
        if items:
            out["__items__"] = [self(v, self.sub(where, i), d) for i, v in enumerate(items)]
        return out

    def omegaconf(self, obj: Any, where: str, depth: int) -> Any:
        """DictConfig/ListConfig -> dict/list of their ``_content``; value nodes -> their ``_val``."""
        if not isinstance(obj, Placeholder):
            return self(obj, where, depth)
        attrs = obj.attributes
        if "_content" in attrs:
            content = attrs["_content"]
            if isinstance(content, Mapping):
                return {str(k): self.omegaconf(v, self.sub(where, k), depth + 1) for k, v in content.items()}
            if isinstance(content, (list, tuple)):
                return [self.omegaconf(v, self.sub(where, i), depth + 1) for i, v in enumerate(content)]
            return self(content, where, depth + 1)  # None or "???" (missing)
        if "_val" in attrs:
            return self.omegaconf(attrs["_val"], where, depth + 1)
        return self(obj, where, depth)


def _numpy_name(dt: Any) -> str:
    resolved = dt.resolve() if isinstance(dt, NumpyDType) else None
    return f"numpy.{resolved.name}" if resolved is not None else "numpy scalar"


def sanitize_tree(root: Any, allowed: frozenset[str]) -> tuple[Any, list[str]]:
    """(the sanitized tree, what was converted). ``allowed``: the allowlist the output must satisfy."""
    s = Sanitizer(allowed)
    return s(root), s.conversions


__all__ = ["Sanitizer", "sanitize_tree"]
