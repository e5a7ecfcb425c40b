"""``ckpt migrate``: plan, atomic write, verify; consolidation of sharded runs, in one or several processes."""

# The surface siblings and users import (``from ckpt_tool.commands.migrate import migrate`` as before the
# package split); the modules below it are the feature's own.
from .call import MigrateCall, migrate
from .command import execute, run_migration
from .plan import Hooks, MigrateOptions, MigratePlan, plan_migration
from .report import MigrateReport

__all__ = [
    "Hooks", "MigrateCall", "MigrateOptions", "MigratePlan", "MigrateReport", "call", "execute", "migrate",
    "plan_migration", "run_migration",
]
