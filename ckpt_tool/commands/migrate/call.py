"""``migrate(src, out, *, strip_prefix=..., ...)``: the Python verb, its keywords declared once (commands/keywords.py).

The core (command.run_migration) takes the SourceOptions, the MigrateOptions
and the Hooks as three values; this is the keyword form Python callers use
(``ckpt_tool.migrate``, ``ckpt_tool.commands.migrate.migrate``).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

from ...formats import Keyed, Limited, TpRulesFile, Unpickling, Unstacking
from ...progress import NO_PROGRESS, Progress
from ..keywords import options_of, source_of, verb
from .command import run_migration
from .plan import Hooks, MigrateOptions

if TYPE_CHECKING:
    from ...io.atomic import CleanReport
    from ...keys import RuleSet
    from .report import MigrateReport


@dataclass(frozen=True)
class MigrateCall(MigrateOptions, TpRulesFile, Unstacking, Limited, Unpickling, Keyed):
    """Rewrite SRC's keys (and format, and dtype) into OUT; see commands/migrate/command.py's docstring.

    ``rules`` replaces the individual rule options when given. ``on_rules``
    is called with rules inferred by ``auto`` before they are applied.
    ``on_cleaned`` is called as soon as stale temporaries of killed runs were
    removed from OUT's folder (or failed to be), whatever happens next.
    ``_after_write`` (tests only) sees the temporary output before it is verified.
    ``unstack_layers`` reads a Megatron torch_dist source with per-layer names (docs/consolidate.md).
    ``sanitize`` rewrites the metadata of a torch output into types
    ``torch.load(weights_only=True)`` accepts (writers/torchsave/sanitize.py) and proves
    the output loads that way in a fresh process; without it, objects read
    as placeholders are written back exactly as they were.
    ``key`` selects the state_dict to write: the output holds that sub-dict alone, unless
    ``keep_container`` writes it back in place inside the rest of the container.
    ``to="hf"`` writes a Hugging Face folder that ``from_pretrained`` loads: the weights as safetensors
    (sharded with ``max_shard_size``) beside the source folder's config and tokenizer files, or those of
    ``config_from``.
    ``allow_overflow`` writes an output even when a cast turned finite values
    into inf/NaN (the counts are in the report); without it that fails, and
    nothing is published.
    ``tp_rules`` names a TOML file saying how a DeepSpeed run's tensor-parallel shards merge
    (docs/consolidate.md); without it, the rules the run records (``universal_checkpoint_info``) are used.
    ``workers`` (default for consolidation sources: one per 2 usable cores and per GiB of output, at most 8;
    1 on fewer than 4 cores: parallel/choice.py) write a safetensors or sharded output from several processes;
    under ``torchrun`` every rank writes its share (commands/migrate/parallel/workers.py).
    """

    src: str | os.PathLike[str]
    out: str | os.PathLike[str] | None = None
    _: KW_ONLY
    progress: Progress | None = None
    on_rules: Callable[[RuleSet], None] | None = None
    on_cleaned: Callable[[CleanReport], None] | None = None
    _after_write: Callable[[str], None] | None = None


def _called(call: MigrateCall) -> MigrateReport:
    hooks = Hooks(progress=call.progress or NO_PROGRESS, on_rules=call.on_rules, on_cleaned=call.on_cleaned,
                  after_write=call._after_write)
    return run_migration(call.src, call.out, source_of(call), options_of(MigrateOptions, call), hooks)


migrate = verb("migrate", MigrateCall, _called)

__all__ = ["MigrateCall", "migrate"]
