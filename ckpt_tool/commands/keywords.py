"""The Python verbs' keyword arguments, each declared once: as a field of a frozen dataclass.

A command's core takes ``(inputs, source: SourceOptions, options: its own
frozen options, hooks)``; Python callers (``ckpt_tool.inspect(path,
stats=True)``, api/) keep typed keyword arguments. Python 3.10 is supported
(setup.cfg) and ``typing.Unpack`` of a TypedDict needs 3.11 (typing_extensions
is no dependency), so each verb's signature is *generated*: a frozen dataclass
(``InspectCall``, ...) inherits the command's own options (``InspectOptions``)
and the one-field bases of the source options the verb offers
(formats/options.py: ``Keyed``, ``Limited``, ...; gate offers no ``unsafe``),
and adds its inputs and hooks. ``verb`` gives the function that dataclass's
constructor signature (a ParamSpec: mypy checks every keyword,
``inspect.signature`` and ``help()`` show it); the call is then split into
the SourceOptions and the command's options. No name, type or default is
written twice.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ParamSpec, TypeVar

from ..formats import DEFAULT_SOURCE, SourceOptions
from ..progress import NO_PROGRESS, Progress

P = ParamSpec("P")
C = TypeVar("C")
R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Counted:
    """The hook of verbs that read tensor data: where the tensors read (or compared) are counted."""

    progress: Progress = NO_PROGRESS


def source_of(call: object) -> SourceOptions:
    """The SourceOptions of a call: the source options it has a field for (the rest at their defaults)."""
    return build_source({f.name: getattr(call, f.name) for f in fields(SourceOptions) if hasattr(call, f.name)})


def build_source(given: dict[str, Any]) -> SourceOptions:
    """SourceOptions from option values by field name, ``tp_rules`` a file (None: not given), parsed here, once
    for the Python verbs and the CLI (cli/options.py): a bad file raises before anything is read."""
    rules_file = given.pop("tp_rules", None)
    if rules_file:
        from ..formats.tp import load_rules

        given["tp_rules"] = load_rules(os.fspath(rules_file))
    return replace(DEFAULT_SOURCE, **given)


def options_of(cls: Callable[..., T], call: object) -> T:
    """The command's own options (``cls``, a dataclass the call inherits) of a call, as a value of that class."""
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]  # cls is a dataclass
    return cls(**{name: getattr(call, name) for name in names})


def verb(name: str, call: Callable[P, C], run: Callable[[C], R]) -> Callable[P, R]:
    """The public function ``name``: its arguments build ``call`` (a dataclass), which ``run`` carries out."""

    def public(*args: P.args, **kwargs: P.kwargs) -> R:
        return run(call(*args, **kwargs))

    public.__name__ = public.__qualname__ = name
    public.__module__ = run.__module__
    public.__doc__ = call.__doc__
    public.__signature__ = inspect.signature(call).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.signature(run).return_annotation)
    return public
