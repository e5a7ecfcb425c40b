"""Find the state_dict inside a container (checkpoint.py describes everything around it).

Works on what the restricted unpickler built (dicts, LazyTensors, inert
placeholders), so a pickled nn.Module yields the keys torch's
``state_dict()`` would produce without its class being importable.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import InputError, LimitExceeded, UsageError
from ...model import Candidate, TensorMeta
from ...pickles.unpickle import LazyTensor, Placeholder, is_module_placeholder
from ...tensors.data import TENSOR_TYPES, is_tensor, packed_items

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


def module_tensors(module: Placeholder, prefix: str, out: dict[str, Any], depth: int = 0,
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
    _count_visit(module, seen)
    attrs = module.attributes
    _own_tensors(attrs, prefix, out)
    modules = attrs.get("_modules") or {}
    if isinstance(modules, Mapping):
        for name, child in modules.items():
            if is_module_placeholder(child):
                module_tensors(child, f"{prefix}{name}.", out, depth + 1, seen)
    for name, value in attrs.items():
        if is_tensor(value) and not name.startswith("_"):
            # plain tensor attributes never reach a state_dict; remembered for warnings
            out.setdefault("\0plain:" + prefix + name, value)


def _count_visit(module: Placeholder, seen: dict[int, int]) -> None:
    """Record a visit of ``module``; too many revisits of shared submodules is a hostile file."""
    if id(module) in seen:
        seen[-1] = seen.get(-1, 0) + 1  # key -1 (never an id) counts the revisits
        if seen[-1] > MAX_SHARED_VISITS:
            raise LimitExceeded("the pickled modules reuse each other so often that their state_dict would be "
                                f"enormous (over {MAX_SHARED_VISITS} visits of shared submodules): a corrupt or "
                                "hostile file")
    seen[id(module)] = 1


def _own_tensors(attrs: Mapping[str, Any], prefix: str, out: dict[str, Any]) -> None:
    """A module's own parameters and persistent buffers, as its state_dict lists them (None entries skipped)."""
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


def real_module_tensors(module: Any) -> OrderedDict[str, Any]:
    return OrderedDict(module.state_dict())


def tensors_of(obj: Any) -> Mapping[str, Any] | None:
    """The state_dict an object stands for, or None if it is not tensor-holding."""
    if is_module_placeholder(obj):
        out: OrderedDict[str, Any] = OrderedDict()
        module_tensors(obj, "", out)
        return OrderedDict((k, v) for k, v in out.items() if not k.startswith("\0"))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return real_module_tensors(obj)
    if isinstance(obj, Mapping):
        if all_tensors_str_keys(obj):
            return obj  # the common flat state_dict (callers only read it)
        found: OrderedDict[str, Any] = OrderedDict()
        other = False
        for k, v in obj.items():
            if is_tensor(v):
                found[str(k)] = v
                continue
            packed = packed_items(str(k), v)
            if packed is not None:
                found.update(packed)
            else:
                other = True
        if other:
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


def all_tensors_str_keys(obj: Mapping[Any, Any]) -> bool:
    """Every key a str and every value a lazy tensor: checked in C-speed passes (200,000 entries)."""
    return bool(obj) and set(map(type, obj.values())) <= _PLAIN_TENSOR_TYPES and set(map(type, obj)) == {str}


def _is_flat_state_dict(obj: Any) -> bool:
    if not isinstance(obj, Mapping) or not obj:
        return False
    if all_tensors_str_keys(obj):
        return True
    tensors = 0
    for k, v in obj.items():
        if type(v) in TENSOR_TYPES or is_tensor(v):
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
            direct = sum(1 for _, c in _children(obj) if is_tensor(c))
            if isinstance(obj, (Mapping, list, tuple)) and len(held) > direct:
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
    elif is_module_placeholder(root) or _is_flat_state_dict(root) or is_real_module(root):
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


def is_real_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)
