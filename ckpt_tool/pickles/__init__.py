
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .advisories import CVE_2025_32434_SCRIPT as CVE_2025_32434_SCRIPT, CVE_2025_32434_TAR as CVE_2025_32434_TAR
    from .pt2_layout import (
        ARCHIVE_FORMAT as ARCHIVE_FORMAT,
        ARCHIVE_FORMAT_VALUE as ARCHIVE_FORMAT_VALUE,
        CONSTANTS_DIR as CONSTANTS_DIR,
        CUSTOM_OBJ_PREFIX as CUSTOM_OBJ_PREFIX,
        FIRST_MEMBER_DIRS as FIRST_MEMBER_DIRS,
        OPAQUE_OBJ_PREFIX as OPAQUE_OBJ_PREFIX,
        WEIGHTS_DIR as WEIGHTS_DIR,
        ConfigError as ConfigError,
        Payload as Payload,
        archive_root as archive_root,
        config_members as config_members,
        model_names as model_names,
        parse_config as parse_config,
    )
    from .scanner import (
        ERROR as ERROR,
        Found as Found,
        ScanFormat as ScanFormat,
        Scanner as Scanner,
        Verdict as Verdict,
        scan_pickle_bytes as scan_pickle_bytes,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "advisories": ("CVE_2025_32434_SCRIPT", "CVE_2025_32434_TAR"),
    "pt2_layout": (
        "ARCHIVE_FORMAT", "ARCHIVE_FORMAT_VALUE", "CONSTANTS_DIR", "CUSTOM_OBJ_PREFIX", "ConfigError",
        "FIRST_MEMBER_DIRS", "OPAQUE_OBJ_PREFIX", "Payload", "WEIGHTS_DIR", "archive_root", "config_members",
        "model_names", "parse_config",
    ),
    "scanner": ("ERROR", "Found", "ScanFormat", "Scanner", "Verdict", "scan_pickle_bytes"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_FORMAT_VALUE",
    "CONSTANTS_DIR",
    "CUSTOM_OBJ_PREFIX",
    "CVE_2025_32434_SCRIPT",
    "CVE_2025_32434_TAR",
    "ERROR",
    "FIRST_MEMBER_DIRS",
    "OPAQUE_OBJ_PREFIX",
    "WEIGHTS_DIR",
    "ConfigError",
    "Found",
    "Payload",
    "ScanFormat",
    "Scanner",
    "Verdict",
    "archive_root",
    "config_members",
    "model_names",
    "parse_config",
    "scan_pickle_bytes",
    "severity",
]
