"""Megatron-LM's checkpoints: legacy ``mp_rank_XX`` folders merged by rules, and ``torch_dist`` DCP folders.

Each name is imported from its module on first use (PEP 562): detect.py's
folder test does not import the torch_dist reader, nor a DCP read the legacy one.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .legacy_folder import is_megatron_legacy, read_megatron_legacy
    from .torch_dist import describe, unstack

_MODULES = {"is_megatron_legacy": "legacy_folder", "read_megatron_legacy": "legacy_folder",
            "describe": "torch_dist", "unstack": "torch_dist"}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["describe", "is_megatron_legacy", "read_megatron_legacy", "unstack"]
