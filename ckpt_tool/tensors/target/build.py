"""Build the module a checkpoint is meant to load into, from ``module:Name`` or ``file.py:Name``.

From Python the target may also be the class, factory or instance itself.
``--target-kwargs`` objects with a ``"()"`` key are built first by the
callable they name (target_kwargs.py); names are resolved in specs.py.

The module is built on the meta device where it can be, so describing the
state_dict of a 70B-parameter target costs no memory; its state_dict becomes
TensorMeta records (no storage), the same vocabulary a checkpoint has.
Importing this module does not import torch; building a target does.
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from ...errors import TargetError, UsageError
from ...model import TensorMeta
from .kwargs import KwargsCallFailed, build_kwargs, plan_kwargs
from .specs import binding_error, describe, first_line, import_spec_module, resolve, split_spec, user_code

if TYPE_CHECKING:
    from torch.nn import Module

# What a target may be: a SPEC string (the CLI's), or from Python an nn.Module class, a factory or an instance.
TargetSpec: TypeAlias = "str | Module | type[Module] | Callable[..., Module]"


@dataclass(frozen=True)
class Target:
    """A built target module and its state_dict as metadata."""

    spec: str  # the SPEC, or target_label() of a Python object
    module: Any  # the torch.nn.Module
    device: str  # "meta" or "cpu": where it was built
    tensors: tuple[TensorMeta, ...]  # its state_dict as metadata (storage=None)
    plain_tensor_attributes: tuple[str, ...]  # tensors held as plain attributes (never reach a state_dict)
    warnings: tuple[str, ...]
    lazy: tuple[str, ...] = ()  # uninitialized (lazy) parameters: any shape loads into them
    extra_state: tuple[str, ...] = ()  # non-tensor state_dict entries (get_extra_state), not compared

    @property
    def keys(self) -> list[str]:
        return [t.key for t in self.tensors]

    @property
    def by_key(self) -> dict[str, TensorMeta]:
        return {t.key: t for t in self.tensors}

    @property
    def attribute_prefixes(self) -> list[str]:
        """``name.`` for the one direct child that holds all of the target's state (a wrapper's ``model.``)."""
        children = [name for name, _ in self.module.named_children()]
        if len(children) == 1 and not list(self.module.named_parameters(recurse=False)):
            return [children[0] + "."]
        return []


def parse_target_kwargs(text: str | None) -> dict[str, Any]:
    """``--target-kwargs`` as a dict: a JSON object, or ``@file.json`` holding one."""
    if text is None or not text.strip():
        return {}
    source = "--target-kwargs"
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise UsageError(f"--target-kwargs: cannot read {path!r}: {exc.strerror}") from None
        source = f"--target-kwargs {path}"
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object like '{{\"hidden\": 16}}', not {_json_kind(value)}")
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def target_label(spec: TargetSpec) -> str:
    """How a target reads in reports and fix commands: a SPEC as given, a Python object by its import name.

    A class, a factory or an instance reads ``module:QualName`` (of the
    instance's class): the SPEC the CLI takes for it when the module is
    importable, so a printed fix command runs (an instance built with other
    arguments needs ``--target-kwargs`` there too).
    """
    if isinstance(spec, str):
        return spec
    of = spec if isinstance(spec, type) or inspect.isroutine(spec) else type(spec)
    return f"{getattr(of, '__module__', '?')}:{getattr(of, '__qualname__', type(of).__name__)}"


def build_target(spec: TargetSpec, kwargs: Mapping[str, Any] | None = None, *, meta: bool = True) -> Target:
    """Import and construct a target module; on the meta device unless ``meta`` is False.

    ``spec`` is a SPEC string, or (from Python) an nn.Module class, a factory
    function or an instance; an instance is described as it is, never
    modified. ``"()"`` objects in ``kwargs`` are built first (target_kwargs.py).
    When construction on the meta device raises, the module is built on the
    CPU instead and a warning says so.
    """
    import torch

    kwargs = dict(kwargs or {})
    if isinstance(spec, str):
        where, name = split_spec(spec)
        obj = resolve(import_spec_module(where, spec), name, spec, where)
    else:
        obj = spec
    spec = target_label(spec)
    warnings: list[str] = []
    if isinstance(obj, torch.nn.Module):
        if kwargs:
            raise TargetError(f"target {spec!r} is a module instance; --target-kwargs cannot be applied to it")
        module, device = obj, _device_of(obj)
    elif isinstance(obj, type) and not issubclass(obj, torch.nn.Module):
        raise TargetError(
            f"target {spec!r} is {describe(obj)}, not an nn.Module class, a factory function or a module instance"
        )
    elif callable(obj):
        _check_kwargs(obj, kwargs, spec)
        module, device = _construct(obj, kwargs, spec, meta, warnings)
    else:
        raise TargetError(
            f"target {spec!r} is {describe(obj)}, not an nn.Module class, a factory function or a module instance"
        )
    tensors, lazy, extra = state_dict_meta(module)
    plain = plain_tensor_attributes(module)
    if plain:
        shown = ", ".join(plain[:8]) + (f" and {len(plain) - 8} more" if len(plain) > 8 else "")
        warnings.append(
            f"target holds {len(plain)} tensor(s) as plain attributes, not parameters or buffers, so they never "
            f"reach a state_dict and are never saved or loaded: {shown} (register them with "
            "nn.Parameter or register_buffer)"
        )
    if extra:
        warnings.append(f"target state_dict has non-tensor entries that are not compared: {', '.join(extra[:8])}")
    if lazy:
        warnings.append(f"target has {len(lazy)} uninitialized lazy parameter(s); their shapes are not checked")
    return Target(spec, module, device, tuple(tensors), tuple(plain), tuple(warnings), tuple(lazy), tuple(extra))


def _check_kwargs(factory: Any, kwargs: dict[str, Any], spec: str) -> None:
    """Bad keyword arguments are reported before anything is built (and before any CPU fallback)."""
    exc = binding_error(factory, kwargs)
    if exc is None:
        return
    if not kwargs:
        raise TargetError(f"target {spec!r} needs arguments ({exc}): pass them with --target-kwargs JSON")
    raise TargetError(f"target {spec!r} does not accept these --target-kwargs: {exc}")


def _construct(factory: Any, kwargs: dict[str, Any], spec: str, meta: bool, warnings: list[str]) -> tuple[Any, str]:
    import torch

    plan = plan_kwargs(kwargs)  # every "()" name resolved (and its arguments bound) before anything runs
    if meta:
        try:
            with user_code(), torch.device("meta"):
                module = factory(**build_kwargs(plan))
        except Exception as exc:  # noqa: BLE001 - user code that cannot run on meta: fall back to the CPU
            cause = exc.__cause__ if isinstance(exc, KwargsCallFailed) and exc.__cause__ is not None else exc
            warnings.append(
                f"target could not be built on the meta device ({first_line(cause)}); built on the CPU instead, "
                "which allocates its full size"
            )
        else:
            return _check_module(module, spec), "meta"
    try:
        with user_code():
            args = build_kwargs(plan)
            module = factory(**args)
    except KwargsCallFailed as exc:
        raise TargetError(exc.message) from None
    except Exception as exc:  # noqa: BLE001 - arbitrary user code; any failure is a bad target
        raise TargetError(f"target {spec!r}: constructing it raised {first_line(exc)}") from None
    return _check_module(module, spec), "cpu"


def _check_module(module: Any, spec: str) -> Any:
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TargetError(f"target {spec!r} returned {describe(module)}, not an nn.Module")
    return module


def _device_of(module: Any) -> str:
    for t in list(module.parameters()) + list(module.buffers()):
        return str(t.device.type)
    return "cpu"


def tensor_meta(key: str, t: Any) -> TensorMeta:
    """A torch tensor's metadata, without its storage."""
    dtype = str(t.dtype).removeprefix("torch.")
    return TensorMeta(key, dtype, tuple(int(d) for d in t.shape), tuple(int(s) for s in t.stride()), 0,
                      None, str(t.device.type))


def state_dict_meta(module: Any) -> tuple[list[TensorMeta], list[str], list[str]]:
    """(tensors, lazy parameter keys, non-tensor entries) of ``module.state_dict()``."""
    import torch
    from torch.nn.parameter import is_lazy

    tensors: list[TensorMeta] = []
    lazy: list[str] = []
    extra: list[str] = []
    from ..data import flat_state

    state = module.state_dict(keep_vars=True)
    for key, value in flat_state(state).items():  # packed params' tensors under KEY.0, KEY.1 (as ckpt reads them)
        if not isinstance(value, torch.Tensor):
            extra.append(key)
        elif is_lazy(value):
            lazy.append(key)
            tensors.append(TensorMeta(key, str(value.dtype).removeprefix("torch."), (), None, 0, None, "meta"))
        else:
            tensors.append(tensor_meta(key, value))
    return tensors, lazy, extra


_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})


def plain_tensor_attributes(module: Any) -> list[str]:
    """Tensors held in plain attributes (or lists/dicts of them) of any submodule."""
    import torch

    found: list[str] = []
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr in _MODULE_INTERNALS:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            if isinstance(value, torch.Tensor):
                found.append(name)
            elif isinstance(value, (list, tuple)):
                found.extend(f"{name}[{i}]" for i, v in enumerate(value) if isinstance(v, torch.Tensor))
            elif isinstance(value, dict):
                found.extend(f"{name}[{k!r}]" for k, v in value.items() if isinstance(v, torch.Tensor))
    return found
