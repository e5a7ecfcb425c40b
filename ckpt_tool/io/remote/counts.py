"""Commands on URLs report what reading them cost: ``remote: {requests, bytes}`` in their JSON."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ..paths import remote_session

F = TypeVar("F", bound=Callable[..., Any])


def counts_remote(*names: str) -> Callable[[F], F]:
    """Run the command in its own remote session when an argument in ``names`` is (or holds) a URL,
    and set the returned report's ``remote`` field to that session's counts."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind_partial(*args, **kwargs).arguments
            found: list[str] = []
            for name in names:
                value = bound.get(name)
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(v, (str, os.PathLike)):
                        found.append(os.fspath(v))
            with remote_session(*found) as counted:
                report = func(*args, **kwargs)
            if counted is None:
                return report
            return dataclasses.replace(report, remote=counted.stats())

        return wrapper  # type: ignore[return-value]

    return decorate


def with_remote(out: dict[str, Any], remote: dict[str, int] | None) -> dict[str, Any]:
    """A report's JSON with ``remote`` added when the command read a URL."""
    if remote is not None:
        out["remote"] = dict(remote)
    return out
