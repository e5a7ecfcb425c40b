"""``ckpt_tool.migrate``: rewrite keys, format and dtype of a checkpoint, atomically, and prove the result.

``target`` may be a SPEC or an nn.Module class: the class is passed on by its
import name (``module:QualName``), so verification rebuilds it with
``target_kwargs`` wherever it runs. An instance is refused: verification
loads the output into the target, which would overwrite that module's weights.
SRC is a path: writing a state dict held in memory is ``torch.save`` /
``safetensors.torch.save_file``'s job.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec

from ..commands.migrate import MigrateReport as _MigrateReport, call as _command
from ..errors import UsageError
from ..render import migrate_text as render
from .text import Shown, plural, returning

P = ParamSpec("P")


class MigrateReport(Shown, _MigrateReport):
    """The command's MigrateReport; ``str()`` is the report ``ckpt migrate SRC -o OUT`` prints."""

    def __str__(self) -> str:
        return render(self)

    def summary(self) -> str:
        done = "dry run" if self.dry_run else "written" if self.written else "not written"
        proved = [d for d, ok in self.verified.items() if ok]
        failed = [d for d, ok in self.verified.items() if not ok]
        how = f"FAILED on {', '.join(failed)}" if failed else f"verified on {', '.join(proved)}" if proved else ""
        return (f"{self.source!r} -> {self.output!r}: {plural(len(self.tensors), 'tensor')}, {done}"
                + (f", {how}" if how else ""))


def _target_spec(target: object) -> object:
    """A class given as the target becomes the SPEC naming it; a SPEC (or None) stays as it is."""
    if target is None or isinstance(target, str):
        return target
    if not isinstance(target, type):
        raise UsageError("migrate's target must be a SPEC string or an nn.Module class: verification loads the output "
                         "into the target, which would overwrite the weights of this instance (pass its class, "
                         "with target_kwargs)")
    if "<locals>" in target.__qualname__:
        raise UsageError(f"target {target.__qualname__} is defined inside a function, so nothing can import it: "
                         "define it at module level or pass a SPEC ('path/to/file.py:Name')")
    return f"{target.__module__}:{target.__qualname__}"


def _with_target_spec(command: Callable[P, _MigrateReport]) -> Callable[P, _MigrateReport]:
    @functools.wraps(command)
    def call(*args: P.args, **kwargs: P.kwargs) -> _MigrateReport:
        src = args[0] if args else kwargs.get("src")
        if src is not None and not isinstance(src, (str, os.PathLike)):
            raise UsageError(f"migrate reads SRC from a file, folder or URL, not a {type(src).__name__}: to write a "
                             "state dict you hold, use safetensors.torch.save_file (or torch.save), then migrate "
                             "or gate the file")
        if "target" in kwargs:
            kwargs["target"] = _target_spec(kwargs["target"])
        return command(*args, **kwargs)

    return call


migrate = returning(MigrateReport, _with_target_spec(_command.migrate))

__all__ = ["MigrateReport", "migrate"]
