"""The module a checkpoint is meant to load into: ``--target`` and ``--target-kwargs`` resolved, built, its ties.

specs.py resolves the names a user gives, kwargs.py builds ``"()"``
arguments, build.py the module (on the meta device where it can), ties.py
the names that share one Parameter. Names are imported on first use
(ckpt_tool/lazy.py): naming a target must not import torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .build import (
        Target as Target,
        TargetSpec as TargetSpec,
        build_target as build_target,
        parse_target_kwargs as parse_target_kwargs,
        target_label as target_label,
    )
    from .ties import (
        TiedKey as TiedKey,
        filled_by_ties as filled_by_ties,
        tie_advice as tie_advice,
        tied_groups as tied_groups,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "build": ("Target", "TargetSpec", "build_target", "parse_target_kwargs", "target_label"),
    "ties": ("TiedKey", "filled_by_ties", "tie_advice", "tied_groups"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "Target", "TargetSpec", "TiedKey", "build_target", "filled_by_ties", "parse_target_kwargs", "target_label",
    "tie_advice", "tied_groups",
]
