"""How an API result gets the CLI's text: the command's report, re-classed as a subclass that renders it.

The report classes live in commands/ and cannot print themselves (render/
sits above them). A subclass defined here adds ``__str__`` and nothing else:
no field, no state. ``rebind`` gives the report that class without copying
a field, so the result *is* the command's report (``isinstance`` holds, every
field and method is there) whose ``str()`` also reads as ``ckpt CMD`` prints.

``repr()`` is one line (the report's verdict), where a dataclass repr would
print every field and every tensor; a notebook shows the CLI's text
(``_repr_pretty_``), as ``print(report)`` does.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class _Pretty(Protocol):
    def text(self, text: str) -> None: ...


class Shown:
    """``repr()`` as ``<ClassName summary>``, and IPython's display as the CLI's text."""

    def summary(self) -> str:  # each report says its verdict in a few words
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary()}>"

    def _repr_pretty_(self, p: _Pretty, cycle: bool) -> None:
        p.text(repr(self) if cycle else str(self))


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def rebind(cls: type[R], report: object) -> R:
    """``report`` as an instance of ``cls``, a subclass of its class that adds only methods."""
    base = next(c for c in cls.__mro__[1:] if c is not Shown)
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
