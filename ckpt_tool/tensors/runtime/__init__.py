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
    from .dcpsave import load_for_save, save_dcp
    from .devices import cuda_devices, load_into_target, roundtrip_bytes
    from .environment import DeviceCheck, check_device, probe_torch

EXPORTS: dict[str, tuple[str, ...]] = {
    "devices": ("cuda_devices", "load_into_target", "roundtrip_bytes"),
    "environment": ("DeviceCheck", "check_device", "probe_torch"),
    "dcpsave": ("load_for_save", "save_dcp"),
}
__all__ = [  # every name in EXPORTS: tests/tensors/test_surfaces.py checks
    "DeviceCheck", "check_device", "cuda_devices", "load_for_save", "load_into_target", "probe_torch",
    "roundtrip_bytes", "save_dcp",
]
__getattr__ = lazy_exports(__name__, EXPORTS)
