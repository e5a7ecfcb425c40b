"""``--target-kwargs`` objects built by a callable: the ``"()"`` key of ``logging.config.dictConfig``.

JSON holds numbers, strings, lists and objects; a constructor such as
``BertModel(config)`` needs an object. Inside the keyword arguments, a JSON
object with a key ``"()"`` stands for ``CALLABLE(**the object's other
entries)``, where CALLABLE is named like a target (``package.module:Name`` or
``path/to/file.py:Name``, Name a dotted attribute path such as
``BertConfig.from_json_file``), built innermost first::

    {"config": {"()": "transformers:BertConfig", "hidden_size": 64, "num_hidden_layers": 2}}

Every name is resolved, and its arguments bound to its signature, before
anything is called (``plan_kwargs``), so a typo fails before a model is
built; each error is one line naming the place in the JSON
(``--target-kwargs config.(): transformers:NoSuch not found``). The raw JSON
stays what reports and fix commands repeat.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import CkptError, TargetError
from .specs import binding_error, describe, first_line, import_spec_module, split_spec, user_code

CALL_KEY = "()"
ORIGIN = "--target-kwargs"


@dataclass(frozen=True)
class KwargsCall:
    """One ``"()"`` object: the callable it names, resolved, and its keyword arguments (planned in turn)."""

    where: str  # its place in the JSON: "config.()"
    name: str  # as written: "transformers:BertConfig"
    func: Any  # the resolved callable
    kwargs: Mapping[str, object]  # values: JSON values, lists, dicts, KwargsCall


class KwargsCallFailed(CkptError):
    """A ``"()"`` call raised; on the meta device the target falls back to the CPU, there it is a TargetError."""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, Mapping) else "a string"


def resolve_callable(name: str, where: str) -> Any:
    """The callable ``name`` points at (its module imported); every failure is one TargetError naming ``where``."""
    origin = f"{ORIGIN} {where}"
    try:
        module_part, attr = split_spec(name)
    except TargetError:
        raise TargetError(f"{origin}: {name!r} is not 'package.module:Name' or 'path/to/file.py:Name'") from None
    try:
        obj = import_spec_module(module_part, name)
    except TargetError as exc:
        reason = exc.message.removeprefix(f"target {name!r}: ")
        raise TargetError(f"{origin}: {name} not found: {reason}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - a lazy module's attribute import can raise anything: not found
            raise TargetError(f"{origin}: {name} not found: {module_part} has no {attr!r}") from None
    if not callable(obj):
        raise TargetError(f"{origin}: {name} is {describe(obj)}, not something to call")
    return obj


def _bind(func: Any, kwargs: Mapping[str, object], where: str, name: str) -> None:
    exc = binding_error(func, kwargs)
    if exc is not None:
        raise TargetError(f"{ORIGIN} {where}: {name} does not accept these arguments: {exc}")


def plan_kwargs(kwargs: Mapping[str, object]) -> dict[str, object]:
    """``kwargs`` with each ``"()"`` object resolved into a KwargsCall; nothing is called yet."""
    return {k: _plan(v, k) for k, v in kwargs.items()}


def _plan(value: object, path: str) -> object:
    if isinstance(value, Mapping):
        if CALL_KEY not in value:
            return {k: _plan(v, _join(path, str(k))) for k, v in value.items()}
        where = _join(path, CALL_KEY)
        name = value[CALL_KEY]
        if not isinstance(name, str):
            raise TargetError(f"{ORIGIN} {where}: must be a string naming a callable ('package.module:Name' or "
                              f"'path/to/file.py:Name'), not {_json_kind(name)}")
        func = resolve_callable(name, where)
        inner = {str(k): _plan(v, _join(path, str(k))) for k, v in value.items() if k != CALL_KEY}
        _bind(func, inner, where, name)
        return KwargsCall(where, name, func, inner)
    if isinstance(value, list):
        return [_plan(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def build_kwargs(plan: Mapping[str, object]) -> dict[str, object]:
    """Call every KwargsCall of a plan, innermost first (a fresh object per build: meta, then maybe the CPU)."""
    return {k: _build(v) for k, v in plan.items()}


def _build(value: object) -> object:
    if isinstance(value, KwargsCall):
        args = {k: _build(v) for k, v in value.kwargs.items()}
        try:
            with user_code():
                return value.func(**args)
        except Exception as exc:  # arbitrary user code; its failure is one line naming the place (re-raised)
            raise KwargsCallFailed(f"{ORIGIN} {value.where}: {value.name}(...) raised {first_line(exc)}") from exc
    if isinstance(value, Mapping):
        return {k: _build(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v) for v in value]
    return value
