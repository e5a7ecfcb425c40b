"""How an API result gets the CLI's text: the command's report, re-classed as a subclass that renders it.

The report classes live in commands/ and cannot print themselves (render/
sits above them). A subclass defined here adds ``__str__`` and nothing else:
no field, no state. ``rebind`` gives the report that class without copying
a field, so the result *is* the command's report (``isinstance`` holds, every
field and method is there) whose ``str()`` also reads as ``ckpt CMD`` prints.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def rebind(cls: type[R], report: object) -> R:
    """``report`` as an instance of ``cls``, a subclass of its class that adds only methods."""
    base = cls.__mro__[1]
    if not isinstance(report, base):
        raise TypeError(f"{cls.__qualname__} wraps a {base.__qualname__}, not a {type(report).__qualname__}")
    out: R = object.__new__(cls)
    out.__dict__.update(report.__dict__)  # a frozen dataclass's fields, shared, not copied
    return out


def returning(cls: type[R], command: Callable[P, object]) -> Callable[P, R]:
    """``command`` with its signature, its docstring and its errors, returning its report as a ``cls``."""

    @functools.wraps(command)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return rebind(cls, command(*args, **kwargs))

    return call
