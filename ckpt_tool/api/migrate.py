"""``ckpt_tool.migrate``: rewrite keys, format and dtype of a checkpoint, atomically, and prove the result."""
from __future__ import annotations

from ..commands.migrate import command as _command
from ..commands.migrate.report import MigrateReport as _MigrateReport
from ..render.migrate import render
from .text import returning


class MigrateReport(_MigrateReport):
    """The command's MigrateReport; ``str()`` is the report ``ckpt migrate SRC -o OUT`` prints."""

    def __str__(self) -> str:
        return render(self)


migrate = returning(MigrateReport, _command.migrate)

__all__ = ["MigrateReport", "migrate"]
