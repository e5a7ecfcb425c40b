"""Hugging Face layouts: ``*.index.json`` sharded sets over safetensors or .bin shards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .config import read_json as read_json
    from .deploy import HfOutput as HfOutput, plan_hf_output as plan_hf_output
    from .folders import identify as identify, is_library_folder as is_library_folder
    from .index import read_index as read_index

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "config": ("read_json",),
    "deploy": ("HfOutput", "plan_hf_output"),
    "folders": ("identify", "is_library_folder"),
    "index": ("read_index",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["HfOutput", "identify", "is_library_folder", "plan_hf_output", "read_index", "read_json"]
