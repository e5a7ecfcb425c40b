"""torch's runtime: which devices exist and work, process groups for torchrun ranks, torch's own DCP writer.

devices.py (migrate's device proofs), environment.py (``ckpt doctor``),
distributed.py (gloo for ``migrate`` under torchrun) and dcpsave.py
(``dcp.save`` in one process); distributed.py is used as a module. Names are imported on first use
(ckpt_tool/lazy.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .dcpsave import load_for_save as load_for_save, save_dcp as save_dcp
    from .devices import (
        cuda_devices as cuda_devices,
        load_into_target as load_into_target,
        roundtrip_bytes as roundtrip_bytes,
    )
    from .environment import DeviceCheck as DeviceCheck, check_device as check_device, probe_torch as probe_torch

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "dcpsave": ("load_for_save", "save_dcp"),
    "devices": ("cuda_devices", "load_into_target", "roundtrip_bytes"),
    "environment": ("DeviceCheck", "check_device", "probe_torch"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "DeviceCheck", "check_device", "cuda_devices", "devices", "distributed", "load_for_save", "load_into_target",
    "probe_torch", "roundtrip_bytes", "save_dcp",
]
