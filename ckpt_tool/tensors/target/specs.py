"""Names a user gives for code to run: ``package.module:Name`` or ``path/to/file.py:Name``, Name dotted.

``--target`` names the module to build and ``"()"`` entries of
``--target-kwargs`` the callables that build its arguments (target_kwargs.py);
both are resolved here, and anything the user's code prints goes to stderr.
Importing this module does not import torch.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import TargetError


def split_spec(spec: str) -> tuple[str, str]:
    """``(module or file, dotted Name)``; the last ``:`` separates them (Windows drives keep theirs)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name or (len(where) == 1 and where.isalpha()):
        raise TargetError(f"target {spec!r}: expected 'package.module:Name' or 'path/to/file.py:Name'")
    return where, name


def is_file_spec(where: str) -> bool:
    return where.endswith(".py") or os.sep in where or "/" in where


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Anything user code prints goes to stderr, so ``--json`` stays one document on stdout."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def import_spec_module(where: str, spec: str) -> Any:
    """Import the module part of a spec: a .py file by path, or a dotted module name."""
    if is_file_spec(where):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise TargetError(f"target {spec!r}: no such file {where!r}")
        name = "_ckpt_target_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        folder = os.path.dirname(path)
        if folder not in sys.path:
            # like `python file.py`: the file's own folder is importable (sibling modules)
            sys.path.insert(0, folder)
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"target {spec!r}: cannot load {where!r} as a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            with user_code():
                module_spec.loader.exec_module(module)
        except BaseException as exc:  # arbitrary user code; any failure is a bad target
            sys.modules.pop(name, None)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise TargetError(f"target {spec!r}: importing {where!r} raised {first_line(exc)}") from None
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        # like `python -m`: packages in the current folder are importable
        sys.path.append(cwd)
    try:
        with user_code():
            return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        if exc.name and (where == exc.name or where.startswith(exc.name + ".")):
            raise TargetError(
                f"target {spec!r}: no module named {exc.name!r} (is it installed, or are you in the folder "
                "that holds it? a file works too: path/to/file.py:Name)"
            ) from None
        raise TargetError(f"target {spec!r}: importing {where!r} raised {first_line(exc)}") from None
    except BaseException as exc:  # arbitrary user code; any failure is a bad target
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TargetError(f"target {spec!r}: importing {where!r} raised {first_line(exc)}") from None


def resolve(module: Any, name: str, spec: str, where: str) -> Any:
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            hint = _available(module)
            raise TargetError(
                f"target {spec!r}: {where!r} has no {name!r}" + (f" (it defines: {hint})" if hint else "")
            )
        obj = getattr(obj, part)
    return obj


def _available(module: Any) -> str:
    """Module classes and functions defined in ``module``, as a hint for a misspelt Name."""
    import torch

    names = []
    for attr, value in vars(module).items():
        if attr.startswith("_") or getattr(value, "__module__", None) != module.__name__:
            continue
        if (isinstance(value, type) and issubclass(value, torch.nn.Module)) or inspect.isfunction(value):
            names.append(attr)
    return ", ".join(sorted(names)[:12])


def describe(obj: Any) -> str:
    if inspect.ismodule(obj):
        return f"the Python module {obj.__name__}"
    if isinstance(obj, type):
        return f"the class {obj.__name__}"
    return f"a {type(obj).__name__}"


def binding_error(func: Any, kwargs: Mapping[str, object]) -> TypeError | None:
    """Why ``func(**kwargs)`` would not bind to ``func``'s signature, found before anything is called; None
    when it binds, or when ``func`` has no signature to check (builtins, some C extensions: call and see)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        return exc
    return None
