"""Find the state_dict inside a container, and describe everything around it.

Works on what the restricted unpickler built (dicts, LazyTensors, inert
placeholders), so a pickled nn.Module yields the keys torch's
``state_dict()`` would produce without its class being importable.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from math import prod
from operator import attrgetter
from typing import Any, Iterator, Mapping

from ..errors import CkptError, InputError, LimitExceeded, UsageError
from ..io.source import MemorySource
from ..model import Candidate, Checkpoint, GlobalRef, StorageRef, TensorMeta, contiguous_strides
from ..pickles import severity
from ..pickles.unpickler import DEFAULT_LIMITS, LazyTensor, Limits, NumpyArray, Placeholder, is_module_placeholder
from .base import Loaded

# Where training code conventionally keeps the weights, in order of preference.
WELL_KNOWN_KEYS = (
    "state_dict", "model_state_dict", "model", "module", "net", "network", "model_state",
    "weights", "params", "ema", "state_dict_ema", "model_ema", "ema_state_dict",
    "ema_model", "model_ema_state_dict", "ema_state", "averaged_model", "swa_model", "swa_state_dict",
)
# EMA / weight-averaged copies (timm, torch.optim.swa_utils, ...) come after the regular weights:
# they are chosen only when alone, and otherwise listed as candidates (select one with --key).
NOT_WEIGHTS = ("optimizer", "optimizer_states", "optimizer_state_dict", "optim", "scheduler",
               "lr_scheduler", "lr_schedulers", "scaler", "grad_scaler", "callbacks", "loops")
MAX_DEPTH = 64
MAX_SHARED_VISITS = 100_000  # revisits of shared submodules (tied weights need a handful)
SUMMARY_NODES = 100_000  # values rendered by one summarize() call


_TENSOR_TYPES = (LazyTensor, TensorMeta, NumpyArray)


def is_tensor(obj: Any) -> bool:
    if isinstance(obj, _TENSOR_TYPES):
        # NumPy arrays of strings/objects/big-endian data are metadata, not tensors
        return not isinstance(obj, NumpyArray) or obj.dtype is not None
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _module_tensors(module: Placeholder, prefix: str, out: dict[str, Any], depth: int = 0,
                    seen: dict[int, int] | None = None) -> None:
    """nn.Module.state_dict() on a placeholder: params, persistent buffers, submodules.

    A shared submodule is listed under every name, as torch does; ``seen``
    counts such revisits so a pickle whose modules share each other
    exponentially (a few hundred bytes) cannot expand without end.
    """
    if depth > MAX_DEPTH:
        raise InputError("module nesting is too deep to read")
    if seen is None:
        seen = {}
    if id(module) in seen:
        seen[-1] = seen.get(-1, 0) + 1  # key -1 (never an id) counts the revisits
        if seen[-1] > MAX_SHARED_VISITS:
            raise LimitExceeded("the pickled modules reuse each other so often that their state_dict would be "
                                f"enormous (over {MAX_SHARED_VISITS} visits of shared submodules): a corrupt or "
                                "hostile file")
    seen[id(module)] = 1
    attrs = module.attributes
    params = attrs.get("_parameters") or {}
    buffers = attrs.get("_buffers") or {}
    non_persistent = attrs.get("_non_persistent_buffers_set") or set()
    if not isinstance(non_persistent, (set, frozenset, list, tuple)):
        non_persistent = set()  # a corrupt file can put anything here
    if isinstance(params, Mapping):
        for name, value in params.items():
            if value is not None:
                out[prefix + str(name)] = value
    if isinstance(buffers, Mapping):
        for name, value in buffers.items():
            if value is not None and name not in non_persistent:
                out[prefix + str(name)] = value
    modules = attrs.get("_modules") or {}
    if isinstance(modules, Mapping):
        for name, child in modules.items():
            if is_module_placeholder(child):
                _module_tensors(child, f"{prefix}{name}.", out, depth + 1, seen)
    for name, value in attrs.items():
        if is_tensor(value) and not name.startswith("_"):
            # plain tensor attributes never reach a state_dict; remembered for warnings
            out.setdefault("\0plain:" + prefix + name, value)


def real_module_tensors(module: Any) -> "OrderedDict[str, Any]":
    return OrderedDict(module.state_dict())


def tensors_of(obj: Any) -> "Mapping[str, Any] | None":
    """The state_dict an object stands for, or None if it is not tensor-holding."""
    if is_module_placeholder(obj):
        out: OrderedDict[str, Any] = OrderedDict()
        _module_tensors(obj, "", out)
        return OrderedDict((k, v) for k, v in out.items() if not k.startswith("\0"))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return real_module_tensors(obj)
    if isinstance(obj, Mapping):
        if _all_tensors_str_keys(obj):
            return obj  # the common flat state_dict (callers only read it)
        found = OrderedDict((str(k), v) for k, v in obj.items() if is_tensor(v))
        if len(found) < len(obj):
            tree: OrderedDict[str, Any] = OrderedDict()
            if _tensor_tree(obj, "", tree, 0) and tree:
                return tree
        return found if found else None
    if isinstance(obj, (list, tuple)) and obj:
        tree = OrderedDict()
        return tree if _tensor_tree(obj, "", tree, 0) and tree else None
    return None


def _tensor_tree(obj: Any, prefix: str, out: dict[str, Any], depth: int, seen: set[int] | None = None) -> bool:
    """Flatten nested dicts/lists whose every leaf is a tensor ({"enc": {"w": t}} -> "enc.w").

    Pickled parameter trees (NumPy/JAX-style, lists of layers) name tensors by
    their path, as torch's dotted state_dict keys do. False if any leaf is not a tensor,
    or a container is reached twice (a pickle's shared lists would expand exponentially).
    """
    if depth > MAX_DEPTH:
        return False
    if seen is None:
        seen = set()
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    items = obj.items() if isinstance(obj, Mapping) else enumerate(obj)
    for k, v in items:
        if is_tensor(v):
            out[f"{prefix}{k}"] = v
        elif isinstance(v, (Mapping, list, tuple)) and v and not isinstance(v, Placeholder):
            if not _tensor_tree(v, f"{prefix}{k}.", out, depth + 1, seen):
                return False
        else:
            return False
    return True


_PLAIN_TENSOR_TYPES = frozenset((LazyTensor, TensorMeta))


def _all_tensors_str_keys(obj: Mapping[Any, Any]) -> bool:
    """Every key a str and every value a lazy tensor: checked in C-speed passes (200,000 entries)."""
    return bool(obj) and set(map(type, obj.values())) <= _PLAIN_TENSOR_TYPES and set(map(type, obj)) == {str}


def _is_flat_state_dict(obj: Any) -> bool:
    if not isinstance(obj, Mapping) or not obj:
        return False
    if _all_tensors_str_keys(obj):
        return True
    tensors = 0
    for k, v in obj.items():
        if type(v) in _TENSOR_TYPES or is_tensor(v):
            tensors += 1
        elif not str(k).endswith("_extra_state"):
            return False
    return tensors > 0


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield str(k), v
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield str(i), v
    elif isinstance(obj, Placeholder) and not is_module_placeholder(obj):
        for k, v in obj.attributes.items():
            yield str(k), v


def find_candidates(root: Any) -> list[tuple[str, int]]:
    """Every mapping or module in the container that holds tensors, with counts."""
    found: list[tuple[str, int]] = []
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if depth > MAX_DEPTH or id(obj) in seen:
            return
        seen.add(id(obj))
        held = tensors_of(obj)
        if held:
            found.append((path, len(held)))
            if is_module_placeholder(obj):
                return
            if isinstance(obj, (Mapping, list, tuple)) and len(held) > sum(1 for _, c in _children(obj) if is_tensor(c)):
                return  # a nested tensor tree, flattened whole: its branches are not separate candidates
        for key, child in _children(obj):
            if not is_tensor(child):
                walk(child, f"{path}.{key}" if path else key, depth + 1)

    walk(root, "", 0)
    return found


def resolve_key(root: Any, dotted: str, path: str) -> Any:
    """Follow ``a.b.0`` through mappings, sequences and placeholder attributes."""
    obj = root
    if dotted in ("", "."):
        return obj
    if isinstance(obj, Mapping) and dotted in obj:
        return obj[dotted]
    parts = dotted.split(".")
    i = 0
    while i < len(parts):
        # keys may themselves contain dots: try the longest match first
        for j in range(len(parts), i, -1):
            part = ".".join(parts[i:j])
            nxt = _child(obj, part)
            if nxt is not _MISSING:
                obj = nxt
                i = j
                break
        else:
            raise UsageError(f"--key {dotted!r}: no entry {parts[i]!r} at this level", path)
    return obj


_MISSING = object()


def _child(obj: Any, part: str) -> Any:
    if isinstance(obj, Mapping):
        if part in obj:
            return obj[part]
        for k in obj:
            if str(k) == part:
                return obj[k]
        return _MISSING
    if isinstance(obj, (list, tuple)) and part.isdigit() and int(part) < len(obj):
        return obj[int(part)]
    if isinstance(obj, Placeholder) and part in obj.attributes:
        return obj.attributes[part]
    return _MISSING


def choose(root: Any, key: str | None, path: str) -> tuple[str | None, Any, list[Candidate]]:
    """(chosen dotted key, the object there, all candidates)."""
    if key is None and _is_flat_state_dict(root):
        # the common case needs no walk: the top level is the state_dict
        return "", root, [Candidate("", len(root), True)]
    candidates = find_candidates(root)
    if key is not None:
        chosen_obj = resolve_key(root, key, path)
        if tensors_of(chosen_obj) is None and not is_tensor(chosen_obj):
            raise UsageError(f"--key {key!r} holds no tensors", path)
        chosen = key
    elif is_module_placeholder(root) or _is_flat_state_dict(root) or _is_real_module(root):
        chosen, chosen_obj = "", root
    else:
        chosen, chosen_obj = None, None
        if isinstance(root, Mapping):
            for wk in WELL_KNOWN_KEYS:
                if wk in root and tensors_of(root[wk]):
                    chosen, chosen_obj = wk, root[wk]
                    break
        if chosen is None:
            usable = [c for c in candidates if not _in_optimizer_state(root, c[0])] or candidates
            if usable:
                best = max(usable, key=lambda c: (c[1], -c[0].count(".")))
                chosen = best[0]
                chosen_obj = resolve_key(root, chosen, path)
    # optimizer moments and scheduler state are not state_dicts: list them only if nothing else holds tensors
    weights = [c for c in candidates if not _in_optimizer_state(root, c[0])] or candidates
    cands = [Candidate(p, n, p == chosen) for p, n in candidates if (p, n) in weights or p == chosen]
    if chosen is not None and not any(c.chosen for c in cands):
        held = tensors_of(chosen_obj)
        cands.insert(0, Candidate(chosen, len(held) if held else 0, True))
    return chosen, chosen_obj, cands


def _in_optimizer_state(root: Any, dotted: str) -> bool:
    """True for paths under a NOT_WEIGHTS key or inside an optimizer state_dict ({state, param_groups})."""
    parts = dotted.split(".") if dotted else []
    if parts and parts[0] in NOT_WEIGHTS:
        return True
    obj = root
    for part in parts:
        if isinstance(obj, Mapping) and "param_groups" in obj and "state" in obj:
            return True
        obj = _child(obj, part)
        if obj is _MISSING:
            return False
    return False


def _is_real_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


# ------------------------------------------------------------------ conversion


_INT_ONLY = {int}


def _valid_dims(values: Any) -> bool:
    """A tuple of non-negative ints (C-speed checks: this runs once per tensor)."""
    return type(values) is tuple and (not values or (set(map(type, values)) == _INT_ONLY and min(values) >= 0))


_INT_OR_BOOL = {int, bool}


def _layout_info(shape: Any, stride: Any) -> tuple[tuple[int, ...], tuple[int, ...], int, int] | None:
    """(shape, stride, numel, index of the last element) if both are valid, else None.

    Bools count as the ints they equal (as in torch.Size): the cache in
    metas_of matches (True, 4) to (1, 4), so both must read the same.
    """
    if not (type(shape) is tuple and type(stride) is tuple and len(stride) == len(shape)):
        return None
    dims = shape + stride
    types = set(map(type, dims))
    if not types <= _INT_OR_BOOL:
        return None
    if bool in types:
        shape, stride = tuple(map(int, shape)), tuple(map(int, stride))
        dims = shape + stride
    if dims and min(dims) < 0:
        return None
    numel = prod(shape)
    last = (numel - 1 if stride == contiguous_strides(shape)
            else sum((d - 1) * s for d, s in zip(shape, stride)))
    return shape, stride, numel, last


def metas_of(held: Mapping[str, Any], memory: MemorySource) -> list[TensorMeta]:
    """TensorMetas for a state_dict's values (to_meta, with a fast path for pickled tensors).

    A model has few distinct (shape, stride) pairs, so their checks run once
    per pair; the validated tuples are shared, which also turns a pickle's
    bool dims into ints (as torch.Size does).
    """
    values = list(held.values())
    if set(map(type, values)) == {TensorMeta} and list(map(_KEY, values)) == list(held):
        return values  # already TensorMetas under their own keys (sharded safetensors)
    checked: dict[Any, Any] = {}
    out = []
    append = out.append
    for key, obj in held.items():
        st = obj.storage if type(obj) is LazyTensor else None
        if st is None:
            append(to_meta(key, obj, memory))
            continue
        pair = (obj.shape, obj.stride)
        try:
            info = checked[pair]
        except KeyError:
            info = checked[pair] = _layout_info(*pair)
        except TypeError:  # unhashable dims: to_meta names the tensor
            info = None
        offset = obj.storage_offset
        if info is None or type(offset) is not int or offset < 0:
            append(to_meta(key, obj, memory))  # raises the error that names the tensor
            continue
        shape, stride, numel, last = info
        if numel and (offset + last + 1) * obj.dtype.itemsize > st.nbytes:
            append(to_meta(key, obj, memory))
            continue
        append(TensorMeta(key, obj.dtype.name, shape, stride, offset, st.ref, st.location))
    return out


def to_meta(key: str, obj: Any, memory: MemorySource) -> TensorMeta:
    if type(obj) is LazyTensor:
        st = obj.storage
        shape, stride, offset = obj.shape, obj.stride, obj.storage_offset
        if not (type(shape) is tuple and type(stride) is tuple and len(stride) == len(shape)
                and type(offset) is int and offset >= 0 and _valid_dims(shape + stride)):
            raise InputError(f"tensor {key!r} has an invalid shape, stride or offset")
        if st is None:
            return TensorMeta(key, obj.dtype.name, shape, stride, offset, None, "meta")
        numel = prod(shape)
        if numel:
            # the last element's byte, as TensorMeta.byte_span computes it (inlined: once per tensor)
            last = offset + (numel - 1 if stride == contiguous_strides(shape)
                             else sum((d - 1) * s for d, s in zip(shape, stride)))
            if (last + 1) * obj.dtype.itemsize > st.nbytes:
                raise InputError(f"tensor {key!r} reaches past the end of its storage ({st.nbytes} bytes)")
        return TensorMeta(key, obj.dtype.name, shape, stride, offset, st.ref, st.location)
    if isinstance(obj, TensorMeta):
        return obj if obj.key == key else TensorMeta(key, obj.dtype, obj.shape, obj.stride,
                                                      obj.storage_offset, obj.storage, obj.device)
    if isinstance(obj, NumpyArray):
        if obj.dtype is None:
            raise InputError(f"NumPy array {key!r} has an unsupported dtype {obj.type_string!r}")
        shape = obj.shape
        stride = contiguous_strides(shape)
        if obj.fortran and len(shape) > 1:
            stride = tuple(reversed(contiguous_strides(tuple(reversed(shape)))))
        nbytes = len(obj.data)
        ref = StorageRef(memory, memory.add(obj.data), nbytes)
        return TensorMeta(key, obj.dtype.name, shape, stride, 0, ref, "cpu")
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        # a corrupt module's _parameters can hold anything: never import torch to say so
        raise InputError(f"{key!r} is a {type(obj).__name__}, not a tensor")
    from .torchsource import torch_tensor_meta  # only reached for --unsafe loads

    return torch_tensor_meta(key, obj, memory)


def summarize(obj: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A JSON-safe rendering of metadata: values kept, tensors and objects described.

    At most SUMMARY_NODES values are rendered per call: a pickle's shared
    lists (each holding the next one 2,000 times) would otherwise take forever.
    """
    if budget is None:
        budget = [SUMMARY_NODES]
    budget[0] -= 1
    if depth > 12 or budget[0] < 0:
        return "..."
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, NumpyArray) and obj.dtype is None:
        return f"<ndarray {obj.type_string or '?'} {list(obj.shape)}>"
    if isinstance(obj, (LazyTensor, NumpyArray)):
        dt = obj.dtype.name if obj.dtype else "?"
        return f"<tensor {dt} {list(obj.shape)}>"
    if isinstance(obj, TensorMeta):
        return f"<tensor {obj.dtype} {list(obj.shape)}>"
    if isinstance(obj, bytes):
        return f"<{len(obj)} bytes>"
    if isinstance(obj, Mapping):
        return {str(k): summarize(v, depth + 1, budget) for k, v in list(obj.items())[:2000]}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = list(obj)[:2000]
        return [summarize(v, depth + 1, budget) for v in items]
    if isinstance(obj, Placeholder):
        out: dict[str, Any] = {"__class__": obj.qualname}
        if obj.attributes:
            out.update({str(k): summarize(v, depth + 1, budget) for k, v in obj.attributes.items()})
        elif obj.args:
            out["__args__"] = summarize(list(obj.args), depth + 1, budget)
        return out
    if is_tensor(obj):
        return f"<tensor {str(obj.dtype).replace('torch.', '')} {list(obj.shape)}>"
    return f"<{type(obj).__name__}>"


def detect_framework(root: Any) -> str | None:
    if not isinstance(root, Mapping):
        return None
    # a flat state_dict can have 200,000 str keys: use its key view rather than a copy
    keys = root.keys() if isinstance(root, dict) and set(map(type, root)) == {str} else {str(k) for k in root}
    if "pytorch-lightning_version" in keys or "lightning_version" in keys:
        return "lightning"
    if "ds_version" in keys or "ds_config" in keys or "buffer_names" in keys:
        return "deepspeed"
    if "arch" in keys and "state_dict" in keys:
        return "timm"
    if keys & {"optimizer", "optimizer_state_dict", "epoch", "step", "global_step", "scheduler"}:
        return "training-dict"
    return None


def reference_warnings(refs: list[GlobalRef]) -> list[str]:
    warnings = []
    dangerous = sorted({r.qualname for r in refs if r.severity == severity.DANGEROUS})
    if dangerous:
        warnings.append(
            "dangerous reference(s) in the pickle, NOT executed: " + ", ".join(dangerous)
            + " (run `ckpt scan` for details)"
        )
    suspicious = sorted({r.qualname for r in refs if r.severity == severity.SUSPICIOUS})
    if suspicious:
        shown = ", ".join(suspicious[:8]) + (f" and {len(suspicious) - 8} more" if len(suspicious) > 8 else "")
        warnings.append(
            f"{len(suspicious)} unknown pickled class(es) or function(s) read as inert placeholders "
            f"(not imported, never called): {shown}"
        )
    return warnings


def build(loaded: Loaded, path: str, key: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Checkpoint:
    """Turn a reader's result into a Checkpoint with its state_dict located."""
    try:
        return _build(loaded, path, key, limits)
    except CkptError as exc:
        if exc.path is None:
            exc.path = path  # errors found deep inside the container still name the file
        raise


def _check_limits(held: Mapping[str, Any], limits: Limits) -> None:
    """--max-tensors and --max-key-length, for every format (C-speed passes over the keys)."""
    if len(held) > limits.max_tensors:
        raise LimitExceeded(f"the state_dict holds {len(held)} tensors, over the limit of {limits.max_tensors} "
                            "(raise it with --max-tensors)")
    if held and max(map(len, held)) > limits.max_key_length:
        key = next(k for k in held if len(k) > limits.max_key_length)
        raise LimitExceeded(f"tensor key {key[:40]!r}... is {len(key)} characters long, over the limit of "
                            f"{limits.max_key_length} (raise it with --max-key-length)")


def _build(loaded: Loaded, path: str, key: str | None, limits: Limits) -> Checkpoint:
    root = loaded.root
    memory = MemorySource(path)
    tensors: list[TensorMeta] | None = None
    warnings = list(loaded.warnings)
    held: Mapping[str, Any]
    if loaded.tensors is not None and key is None:
        # the reader built the state_dict itself (safetensors): nothing to locate or convert
        chosen, candidates, held = "", [Candidate("", len(loaded.tensors), True)], root
        tensors = loaded.tensors
    elif key is None and isinstance(root, Mapping) and _all_tensors_str_keys(root):
        # a flat state_dict (the common .pth): choose() and tensors_of() would each
        # test that again, a pass over 200,000 values in some files
        chosen, candidates, held = "", [Candidate("", len(root), True)], root
    else:
        chosen, obj, candidates = choose(root, key, path)
        if chosen is None:
            warnings.append("no tensors found in this file")
            held = {}
        elif is_tensor(obj):
            held = {chosen.rsplit(".", 1)[-1]: obj}
        else:
            held = tensors_of(obj) or {}
            if is_module_placeholder(obj):
                plain: dict[str, Any] = {}
                _module_tensors(obj, "", plain)
                extra = sorted(k[len("\0plain:"):] for k in plain if k.startswith("\0plain:"))
                if extra:
                    warnings.append(
                        "tensors held as plain module attributes never reach a state_dict: " + ", ".join(extra[:8])
                    )
    _check_limits(held, limits)
    if tensors is None:
        tensors = metas_of(held, memory)
    return _checkpoint(loaded, path, chosen, candidates, held, tensors, warnings, memory)


def _checkpoint(
    loaded: Loaded, path: str, chosen: str | None, candidates: list[Candidate], held: Mapping[str, Any],
    tensors: list[TensorMeta], warnings: list[str], memory: MemorySource,
) -> Checkpoint:
    """The Checkpoint around located tensors: layout, metadata beside the state_dict, warnings."""
    root = loaded.root
    layout = loaded.layout or _layout(root, chosen)
    metadata = dict(loaded.metadata)
    if chosen:
        metadata.update(_metadata_without(root, chosen))
    elif chosen == "" and isinstance(root, Placeholder):
        metadata["__class__"] = root.qualname
    elif chosen == "" and isinstance(root, Mapping) and len(held) < len(root):
        # a top-level dict mixing tensors with other values ({"w": ..., "epoch": 3}): keep the others
        metadata.update((str(k), summarize(v)) for k, v in root.items()
                        if not is_tensor(v) and str(k) not in held and not str(k).endswith("_extra_state"))
    warnings.extend(reference_warnings(loaded.references))
    warnings.extend(layout_warnings(tensors))
    sources = tuple(loaded.sources) + ((memory,) if memory.buffers else ())
    return Checkpoint(
        path=path, format=loaded.format, tensors=tuple(tensors), layout=layout,
        state_dict_key=chosen, metadata=metadata,
        # a reader that built the tensors itself has only tensors at its top level: no framework keys
        framework=loaded.framework or (None if loaded.tensors is not None else detect_framework(root)),
        candidates=tuple(candidates), references=tuple(loaded.references), warnings=tuple(warnings),
        root=root, sources=sources,
    )


def _layout(root: Any, chosen: str | None) -> str:
    if chosen == "":
        return "module" if (is_module_placeholder(root) or _is_real_module(root)) else "state_dict"
    if chosen is None:
        return "empty"
    return "container"


def _metadata_without(root: Any, chosen: str) -> dict[str, Any]:
    if not isinstance(root, Mapping):
        return {}
    top = chosen.split(".")[0]
    out = {}
    for k, v in root.items():
        if str(k) == chosen:
            continue
        if str(k) == top and "." in chosen:
            out[str(k)] = "<holds the state_dict>"
            continue
        out[str(k)] = summarize(v)
    return out


_KEY = attrgetter("key")
_DEVICE = attrgetter("device")
_STORAGE_ID = attrgetter("storage_id")


def layout_warnings(tensors: list[TensorMeta]) -> list[str]:
    warnings = []
    all_devices = set(map(_DEVICE, tensors))  # C-speed passes: this runs on 200,000 tensors
    devices = sorted(all_devices - {"cpu", "meta"})
    if devices:
        warnings.append(f"tensors were saved on {', '.join(devices)}; ckpt reads them on the CPU")
    if "meta" in all_devices:
        warnings.append("some tensors were saved on the meta device and hold no data")
    ids = list(map(_STORAGE_ID, tensors))
    if len(set(ids)) == len(ids):
        return warnings  # no storage is shared (the common case, checked at C speed)
    groups: dict[Any, list[str]] = {}
    for t in tensors:
        sid = t.storage_id
        if sid is not None:
            groups.setdefault(sid, []).append(t.key)
    shared = [keys for keys in groups.values() if len(keys) > 1]
    if shared:
        sample = "; ".join(" = ".join(ks[:3]) for ks in shared[:3])
        warnings.append(f"{sum(len(s) for s in shared)} tensors share storage ({sample})")
    return warnings
