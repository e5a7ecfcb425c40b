"""``ckpt migrate``: plan, atomic write, verify; consolidation of sharded runs, in one or several processes."""

# The surface siblings and users import (``from ckpt_tool.commands.migrate import migrate`` as before the
# package split); the modules below it are the feature's own.
from .command import migrate
from .report import MigrateReport

__all__ = ["MigrateReport", "migrate"]
