"""Proving what migrate wrote: bit-for-bit re-reads, values through casts, strict loads on each device."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....lazy import lazy_exports

if TYPE_CHECKING:
    from .casts import (
        CastReport as CastReport,
        apply_losses as apply_losses,
        cast_findings as cast_findings,
        share_losses as share_losses,
    )
    from .compare import MAX_REPORTED as MAX_REPORTED, compare_pairs as compare_pairs
    from .devices import resolve_devices as resolve_devices
    from .early import EarlyCheck as EarlyCheck
    from .hf import check_folder as check_folder, weights_path as weights_path
    from .reread import (
        by_key as by_key,
        close_output as close_output,
        open_output as open_output,
        span_of as span_of,
        unreadable as unreadable,
    )
    from .verify import DeviceChecks as DeviceChecks, Expected as Expected, verify_output as verify_output
    from .weights_only import load_weights_only as load_weights_only

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "casts": ("CastReport", "apply_losses", "cast_findings", "share_losses"),
    "compare": ("MAX_REPORTED", "compare_pairs"),
    "devices": ("resolve_devices",),
    "early": ("EarlyCheck",),
    "hf": ("check_folder", "weights_path"),
    "reread": ("by_key", "close_output", "open_output", "span_of", "unreadable"),
    "verify": ("DeviceChecks", "Expected", "verify_output"),
    "weights_only": ("load_weights_only",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "MAX_REPORTED",
    "CastReport",
    "DeviceChecks",
    "EarlyCheck",
    "Expected",
    "apply_losses",
    "by_key",
    "cast_findings",
    "check_folder",
    "close_output",
    "compare_pairs",
    "load_weights_only",
    "open_output",
    "resolve_devices",
    "share_losses",
    "span_of",
    "unreadable",
    "verify_output",
    "weights_path",
]
