"""The shape of migrate's output besides its tensors: the pickled container, or the stored tensors and metadata.

Each output format's writer shapes it (writers/registry.py), before a byte
is written: what a format cannot hold (tensors inside other objects in a
flat safetensors mapping, dangerous references) is refused there; what a
target would be handed (placeholders) here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ... import writers
from ...errors import UsageError
from ...keys import RuleSet
from ...model import Checkpoint
from ...pickles.unpickle import Placeholder
from ...writers import OutTensor, Shaped, ShapeRequest
from .plan import MigratePlan

if TYPE_CHECKING:
    from ...tensors.target import Target


def refuse_opaque(built: Target, chosen: object, rules: RuleSet) -> None:
    """A target cannot be handed the placeholders of its extra state: refuse before writing."""
    if not built.extra_state or not isinstance(chosen, Mapping):
        return
    opaque = [k for k, v in chosen.items() if isinstance(v, Placeholder) and rules.new_key(str(k))
              in built.extra_state]
    if opaque:
        raise UsageError(f"--target cannot load {', '.join(map(repr, opaque[:3]))}: "
                         f"{chosen[opaque[0]].qualname} "
                         "objects are read as inert placeholders and never rebuilt (ckpt runs no code from "
                         "the file), so the target check cannot hand them to the module; migrate without "
                         "--target, and load the output with torch.load(weights_only=False) only if you "
                         "trust the file")


def shape_output(ck: Checkpoint, plan: MigratePlan, chosen: object, tensors: Sequence[OutTensor]) -> Shaped:
    """The output's container besides its tensors, shaped by its format's writer (writers/registry.py)."""
    o = plan.output
    request = ShapeRequest(ck=ck, chosen=chosen, tensors=tensors, rules=plan.rules, source=plan.source.path,
                           state_dict_only=o.state_dict_only, sanitize=o.sanitize, hf=o.hf)
    return writers.writer(o.format).shape(request)

