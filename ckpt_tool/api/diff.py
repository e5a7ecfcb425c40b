"""``ckpt_tool.diff``: what happens if A's weights are loaded where B (or a target) is expected.

A and B are paths, or state dicts or nn.Modules in memory (commands/inputs.py);
``target`` is a SPEC, or an nn.Module class (built on the meta device with
``target_kwargs``) or instance (described as it is, never modified).
"""
from __future__ import annotations

from ..commands.diff import DiffReport as _DiffReport, call as _call
from ..render import diff_text as render
from .text import Shown, plural, returning


class DiffReport(Shown, _DiffReport):
    """The command's DiffReport; ``str()`` is the text ``ckpt diff A B`` prints, ``repr()`` its verdict."""

    def __str__(self) -> str:
        return render(self)

    def summary(self) -> str:
        found = [plural(len(items), what) for items, what in (
            (self.missing, "missing key"), (self.unexpected, "unexpected key"),
            (self.shape_mismatch, "shape mismatch"), (self.dtype_mismatch, "dtype mismatch"),
            (self.value_mismatch, "value mismatch")) if items]
        verdict = ", ".join(found) if found else "no differences" if self.compared_values else (
            "no key, shape or dtype differences")
        return f"{self.a!r} vs {self.b!r}: {verdict}"


diff = returning(DiffReport, _call.diff)

__all__ = ["DiffReport", "diff"]
