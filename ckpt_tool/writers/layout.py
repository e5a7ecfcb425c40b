"""What goes around the tensors: the container a torch output keeps, the
metadata a safetensors output can hold, and which tensors are ties.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import RuleConflict
from ..format_names import Format
from ..keys import RuleSet
from ..model import Checkpoint
from ..pickles.unpickle import Placeholder, is_module_placeholder
from ..tensors.data import is_tensor, packed_items
from .base import OutTensor
from .torchsave import make_state_dict

_LEAF = "\x00leaf"


def dedupe(tensors: Sequence[OutTensor]) -> tuple[list[OutTensor], dict[str, str], list[str]]:
    """(tensors to store, alias -> stored key, warnings) for formats that hold each tensor once.

    Tensors that are the same view of the same storage (tied weights) are
    stored once; tensors that merely overlap in a storage are stored as
    separate copies, with a warning, as safetensors cannot express that.
    """
    ids = [t.source.storage_id for t in tensors]
    if None not in ids and len(set(ids)) == len(ids):
        return list(tensors), {}, []  # no two tensors share a storage (the common case): nothing to tie
    stored: list[OutTensor] = []
    aliases: dict[str, str] = {}
    first_by_view: dict[object, str] = {}
    storages: dict[object, list[str]] = {}
    for t in tensors:
        vk = t.view_key()
        if vk is not None and vk in first_by_view:
            aliases[t.key] = first_by_view[vk]
            continue
        if vk is not None:
            first_by_view[vk] = t.key
            storages.setdefault(t.source.storage_id, []).append(t.key)
        stored.append(t)
    warnings = []
    partial = [keys for keys in storages.values() if len(keys) > 1]
    if partial:
        sample = "; ".join(" + ".join(k[:3]) for k in partial[:3])
        warnings.append(f"{sum(len(k) for k in partial)} tensors are different views of one storage ({sample}); "
                        "safetensors stores each as its own contiguous copy")
    return stored, aliases, warnings


def _find_path(root: Any, target: Any, depth: int = 0) -> list[Any] | None:
    """The keys leading from ``root`` to the object ``target`` (by identity)."""
    if root is target:
        return []
    if depth > 64:
        return None
    if isinstance(root, Mapping):
        items = list(root.items())
    elif isinstance(root, (list, tuple)):
        items = list(enumerate(root))
    else:
        return None
    for k, v in items:
        if is_tensor(v):
            continue
        sub = _find_path(v, target, depth + 1)
        if sub is not None:
            return [k, *sub]
    return None


def _copy_mapping(m: Mapping[Any, Any]) -> Any:
    new = OrderedDict(m) if isinstance(m, OrderedDict) else dict(m)
    if isinstance(m, OrderedDict) and getattr(m, "__dict__", None):
        new.__dict__.update(m.__dict__)
    return new


def _replace_at(root: Any, path: list[Any], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(root, Mapping):
        new = _copy_mapping(root)
        new[head] = _replace_at(root[head], rest, value)
        return new
    items = list(root)
    items[head] = _replace_at(items[head], rest, value)
    return type(root)(items) if isinstance(root, tuple) else items


def module_metadata(md: Any, rules: RuleSet) -> Any:
    """A state_dict's ``_metadata`` (per-module versions) with module paths rewritten like the keys."""
    if not isinstance(md, Mapping):
        return None
    out: OrderedDict[str, Any] = OrderedDict()
    for prefix, value in md.items():
        probe = f"{prefix}.{_LEAF}" if prefix else _LEAF
        new = rules.new_key(probe)
        if new is None or not new.endswith(_LEAF):
            continue
        key = new[: -len(_LEAF)].rstrip(".")
        out.setdefault(key, value)
    return out


def new_state_dict(chosen: Any, tensors: Sequence[OutTensor], by_source: dict[str, OutTensor],
                   rules: RuleSet) -> Any:
    """The output state_dict: the chosen mapping's entries in order, tensors replaced, keys rewritten.

    Non-tensor entries (``*._extra_state``) follow the same key rules.
    """
    if not isinstance(chosen, Mapping) or is_module_placeholder(chosen):
        return OrderedDict((t.key, t) for t in tensors)
    items: list[tuple[str, Any]] = []
    seen: dict[str, str] = {}
    for k, v in chosen.items():
        key = str(k)
        if is_tensor(v):
            t = by_source.get(key)
            if t is not None:
                items.append((t.key, t))
                seen[t.key] = key
            continue
        packed = packed_items(key, v)
        if packed is not None:
            group = _packed_group(key, v, packed, by_source, rules)
            if group is not None:
                if group[0] in seen:
                    raise RuleConflict(f"{seen[group[0]]!r} and {key!r} would both become {group[0]!r}")
                seen[group[0]] = key
                items.append(group)
            continue
        new = rules.new_key(key)
        if new is None:
            continue
        if new in seen:
            raise RuleConflict(f"{seen[new]!r} and {key!r} would both become {new!r}")
        seen[new] = key
        items.append((new, v))
    sd = make_state_dict(chosen, items)
    md = module_metadata(getattr(chosen, "_metadata", None), rules)
    if md is not None and isinstance(sd, OrderedDict):
        sd._metadata = md  # type: ignore[attr-defined]
    return sd


def _packed_group(key: str, value: Any, members: list[tuple[str, Any]], by_source: dict[str, OutTensor],
                  rules: RuleSet) -> tuple[str, Any] | None:
    """(new key, tuple) of a quantized module's packed params, its tensors replaced; None when the rules
    dropped all of them. They are one object to torch: renamed and dropped together, or refused."""
    kept = [by_source.get(k) for k, _ in members]
    new = rules.new_key(key)
    if all(t is None for t in kept) and new is None:
        return None
    if new is None or any(t is None for t in kept):
        raise RuleConflict(f"{key!r} holds a quantized layer's packed weight and bias, which load together: "
                           f"drop all of {', '.join(repr(k) for k, _ in members)} (e.g. --drop '{key}*') or none")
    by_member = {k: t for (k, _), t in zip(members, kept, strict=True)}
    out = []
    for i, item in enumerate(value):
        t = by_member.get(f"{key}.{i}")
        if item is not None and (t is None or t.key != f"{new}.{i}"):
            raise RuleConflict(f"{key}.{i} would become {t.key if t else None!r}, but its packed params "
                               f"{key!r} become {new!r}: rename them with one rule on the module's prefix")
        out.append(t if item is not None else None)
    return new, tuple(out) if isinstance(value, tuple) else out


def torch_root(ck: Checkpoint, chosen: Any, tensors: Sequence[OutTensor], rules: RuleSet,
               state_dict_only: bool) -> tuple[Any, str, list[str], list[str]]:
    """(object to pickle, dotted key of the state_dict in it, metadata keys kept, warnings) for a torch output."""
    by_source = {t.source.key: t for t in tensors}
    sd = new_state_dict(chosen, tensors, by_source, rules)
    warnings: list[str] = []
    root = ck.root
    if state_dict_only or ck.state_dict_key in (None, "") or ck.layout != "container":
        if not state_dict_only and ck.layout in ("module", "torchscript"):
            what = "a pickled nn.Module" if ck.layout == "module" else "a TorchScript archive"
            warnings.append(f"the source is {what}; the output holds its state_dict "
                            "(load it with model.load_state_dict)")
        if not state_dict_only and ck.format == Format.SAFETENSORS:
            dropped = [k for k in _string_metadata(ck) if k != "format"]
            if dropped:
                warnings.append("safetensors __metadata__ not kept in a torch file: " + ", ".join(dropped[:8]))
        return sd, "", [], warnings
    path = _find_path(root, chosen)
    if path is None:
        warnings.append("could not place the state_dict back in its container; the output holds the state_dict alone")
        return sd, "", [], warnings
    if is_module_placeholder(chosen):
        warnings.append(f"the pickled module at {ck.state_dict_key!r} is written as its state_dict")
    new_root = _replace_at(root, path, sd)
    kept = [str(k) for k in root if str(k) != str(path[0])] if isinstance(root, Mapping) else []
    return new_root, ".".join(str(p) for p in path), kept, warnings


def entries_holding_tensors(chosen: Any, keys: Sequence[str]) -> list[str]:
    """Non-tensor entries of a state_dict mapping that hold tensors inside (a TorchBind object's state,
    a tuple of tensors) that are not among its tensors ``keys`` (a nested tree of tensors is flattened
    into them): a format that stores only a flat mapping of tensors would lose them."""
    if not isinstance(chosen, Mapping) or is_module_placeholder(chosen):
        return []
    found = [str(k) for k, v in chosen.items()
             if not is_tensor(v) and packed_items(str(k), v) is None and _holds_tensor(v, 0)]
    if not found:
        return found  # the common case: no prefix set to build
    prefixes = {key[:i] for key in keys for i, ch in enumerate(key) if ch == "."}
    return [k for k in found if k not in prefixes]


def _holds_tensor(obj: Any, depth: int) -> bool:
    if is_tensor(obj):
        return True
    if depth > 32:
        return False
    if isinstance(obj, Placeholder):
        if obj._ckpt_module.startswith("torch") and obj._ckpt_name.startswith("_rebuild"):
            return True  # a tensor torch rebuilds in a way ckpt keeps as a record (an unusual wrapper, sparse)
        obj = list(obj.__dict__.values())
    if isinstance(obj, Mapping):
        return any(_holds_tensor(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(_holds_tensor(v, depth + 1) for v in obj)
    return False


def placeholders_in(obj: Any, skip: Any = None, path: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """(where, class) of every placeholder a torch output would have to write."""
    if obj is skip or depth > 64:
        return []
    if isinstance(obj, Placeholder):
        return [(path or "<top>", obj.qualname)]
    found: list[tuple[str, str]] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not is_tensor(v):
                found += placeholders_in(v, skip, f"{path}.{k}" if path else str(k), depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            found += placeholders_in(v, skip, f"{path}.{i}" if path else str(i), depth + 1)
    return found


def _string_metadata(ck: Checkpoint) -> dict[str, str]:
    """The source's string metadata (safetensors ``__metadata__``), minus alias records."""
    meta = ck.metadata.get("__metadata__") if ck.format == Format.SAFETENSORS else None
    if not isinstance(meta, Mapping):
        return {}
    keys = set(ck.keys)
    return {str(k): str(v) for k, v in meta.items() if not (k in keys and v in keys)}


def _entries_without_tensors(ck: Checkpoint, chosen: Any) -> list[str]:
    """Keys of the state_dict itself whose values hold no tensor (``_extra_state``, a dtype, a count)."""
    if not isinstance(chosen, Mapping):
        return []
    keys = set(ck.keys)
    others = [str(k) for k, v in chosen.items() if not is_tensor(v) and str(k) not in keys]
    return [k for k in others if not any(key.startswith(f"{k}.") for key in keys)]  # a tree of tensors is kept


def safetensors_metadata(ck: Checkpoint, chosen: Any,
                         state_dict_only: bool) -> tuple[dict[str, str], list[str], list[str]]:
    """(``__metadata__`` entries, kept keys, warnings): strings are kept, anything else is named."""
    meta: dict[str, str] = {}
    lost = _entries_without_tensors(ck, chosen)
    warnings = [] if not lost else [
        "state_dict entries that hold no tensor are not kept in safetensors (it stores only tensors): "
        + ", ".join(lost[:10]) + (" ..." if len(lost) > 10 else "")
        + "; load_state_dict(strict=True) reports them missing: write a .pth to keep them"]
    if state_dict_only:
        return {"format": "pt"}, [], warnings
    meta.update(_string_metadata(ck))
    dropped: list[str] = []
    root = ck.root
    if ck.layout == "container" and isinstance(root, Mapping):
        path = _find_path(root, chosen)
        top = str(path[0]) if path else None
        for k, v in root.items():
            if str(k) == top:
                continue
            if isinstance(v, str):
                meta[str(k)] = v
            else:
                dropped.append(str(k))
    kept = sorted(meta)
    meta.setdefault("format", "pt")  # Hugging Face loaders require it once any metadata is present
    if dropped:
        warnings.append("not kept in safetensors (it stores only string metadata): " + ", ".join(dropped[:10])
                        + (" ..." if len(dropped) > 10 else "") + "; write a .pth to keep them")
    return meta, kept, warnings
