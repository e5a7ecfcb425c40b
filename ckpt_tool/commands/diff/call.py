"""``diff(a, b, *, values=..., ...)``: the Python verb, its keywords declared once (commands/keywords.py).

The command runs a plan (plan.py: SourceOptions + DiffOptions); this is the
keyword form Python callers use (``ckpt_tool.diff``, ``ckpt_tool.commands.diff.diff``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...formats import Keyed, Limited, Predicting, TpRulesFile, Unpickling
from ..inputs import CheckpointInput
from ..keywords import Counted, options_of, source_of, verb
from .command import run_diff
from .plan import DiffHooks, DiffOptions, check_options, diff_plan
from .report import DiffReport


@dataclass(frozen=True)
class DiffCall(DiffOptions, Counted, TpRulesFile, Predicting, Limited, Unpickling, Keyed):
    """Compare checkpoint ``a`` with checkpoint ``b`` or with a ``target`` module spec.

    ``key`` selects A's state_dict (and B's, unless ``key_b`` is given).
    ``values`` compares the data of every common key of equal shape,
    reading one tensor pair at a time, and reports the pairs done to
    ``progress`` ("comparing values").
    ``torch_version``: whose weights_only rules predict torch.load of each side.
    ``rules`` (strip/add prefix, rename: migrate's RuleSet) rewrite A's keys
    before anything is compared, exactly as ``ckpt migrate`` would; ``auto``
    then infers and applies the rewrite that makes A's keys match B's.
    ``view``: the order, cut, rollups and histograms of the ``--values`` figures.
    ``tp_rules`` names a TOML file saying how tensor-parallel shards merge (a Megatron-LM ``mp_rank_XX``
    folder, a DeepSpeed run without universal_checkpoint_info), on either side, as ``ckpt migrate`` reads it.
    """

    a: CheckpointInput
    b: CheckpointInput | None = None


def _called(call: DiffCall) -> DiffReport:
    options = options_of(DiffOptions, call)
    check_options(call.b is not None, options)  # its usage errors before a bad rules file's
    return run_diff(diff_plan(call.a, call.b, source_of(call), options), DiffHooks(call.progress))


diff = verb("diff", DiffCall, _called)

__all__ = ["DiffCall", "diff"]
