"""Build the Checkpoint: a reader's result with its state_dict located and described.

locate.py finds the state_dict, metas.py turns its tensors into TensorMetas;
this module checks the limits, keeps the metadata beside the state_dict
(summarized, JSON-safe), names the framework and gathers the warnings.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import CkptError, LimitExceeded
from ...io import MemorySource
from ...limits import DEFAULT_LIMITS, Limits
from ...model import Candidate, Checkpoint, Deferred, GlobalRef, TensorMeta
from ...pickles import severity
from ...pickles.unpickle import LazyTensor, NumpyArray, NumpyScalar, Placeholder, is_module_placeholder
from ...tensors.data import is_tensor, packed_items
from ..interface import Loaded
from .locate import all_tensors_str_keys, choose, is_real_module, module_tensors, tensors_of
from .metas import layout_warnings, metas_of, record_warnings

SUMMARY_NODES = 100_000  # values rendered by one summarize() call


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
        return obj.python() if isinstance(obj, NumpyScalar) else obj
    if isinstance(obj, Deferred):
        return obj  # a value left unread: rendered by its description (json_safe), recognised by diff
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


def file_danger(name: str, refs: Sequence[GlobalRef], how: str = "") -> list[str]:
    """One warning naming a file of a folder whose pickle calls something dangerous (the folder's loader opens it)."""
    dangerous = sorted({r.qualname for r in refs if r.severity == severity.DANGEROUS})
    if not dangerous:
        return []
    opened = f" (its loader opens it with {how})" if how else ""
    return [f"{name}{opened}: dangerous reference(s), NOT executed: {', '.join(dangerous)}"]


def reference_warnings(refs: Sequence[GlobalRef]) -> list[str]:
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


def build_checkpoint(loaded: Loaded, path: str, key: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Checkpoint:
    """Turn a reader's result into a Checkpoint with its state_dict located."""
    try:
        return _build(loaded, path, key, limits)
    except CkptError as exc:
        if exc.path is None:
            exc.path = path  # errors found deep inside the container still name the file
        raise


def located_tensors(loaded: Loaded, path: str) -> list[TensorMeta]:
    """The tensors of one part of a larger set (a shard, a component), located as ``build`` locates them."""
    return list(build_checkpoint(loaded, path).tensors)


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
    tensors: Sequence[TensorMeta] | None = None
    warnings = list(loaded.warnings)
    held: Mapping[str, Any]
    if loaded.tensors is not None and key is None:
        # the reader built the state_dict itself (safetensors): nothing to locate or convert
        chosen: str | None
        chosen, candidates, held = "", [Candidate("", len(loaded.tensors), True)], root
        tensors = loaded.tensors
    elif key is None and isinstance(root, Mapping) and all_tensors_str_keys(root):
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
                module_tensors(obj, "", plain)
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
    tensors: Sequence[TensorMeta], warnings: list[str], memory: MemorySource,
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
                        if not is_tensor(v) and str(k) not in held and not str(k).endswith("_extra_state")
                        and packed_items(str(k), v) is None)  # packed params' tensors are in held
    warnings.extend(reference_warnings(loaded.references))
    warnings.extend(layout_warnings(tensors))
    warnings.extend(record_warnings(root, loaded.references))
    sources = tuple(loaded.sources) + ((memory,) if memory.buffers else ())
    return Checkpoint(
        path=path, format=loaded.format, tensors=tuple(tensors), layout=layout,
        state_dict_key=chosen, metadata=metadata,
        # a reader that built the tensors itself has only tensors at its top level: no framework keys
        framework=loaded.framework or (None if loaded.tensors is not None else detect_framework(root)),
        candidates=tuple(candidates), references=tuple(loaded.references), warnings=tuple(warnings),
        root=root, sources=sources, weights_only=loaded.weights_only,
    )


def _layout(root: Any, chosen: str | None) -> str:
    if chosen == "":
        return "module" if (is_module_placeholder(root) or is_real_module(root)) else "state_dict"
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
