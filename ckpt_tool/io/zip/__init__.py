"""The one zip reader and what is built on it: torch's (miniz's) reading of an archive, its storages,
the scanner's sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .archive import UNSUPPORTED_FLAGS as UNSUPPORTED_FLAGS, Member as Member, ZipArchive as ZipArchive
    from .source import zip_source as zip_source
    from .sweep import (
        member_blob as member_blob,
        read_directory as read_directory,
        sweep_local_headers as sweep_local_headers,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "archive": ("Member", "UNSUPPORTED_FLAGS", "ZipArchive"),
    "source": ("zip_source",),
    "sweep": ("member_blob", "read_directory", "sweep_local_headers"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "UNSUPPORTED_FLAGS",
    "Member",
    "ZipArchive",
    "member_blob",
    "read_directory",
    "sweep_local_headers",
    "zip_source",
]
