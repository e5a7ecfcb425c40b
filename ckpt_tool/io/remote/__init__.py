"""URLs read by byte ranges: the session, the file, one fetcher per protocol, and what reading cost."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .counts import counts_remote as counts_remote, with_remote as with_remote
    from .protocols import (
        folder_bytes as folder_bytes,
        is_file as is_file,
        is_folder as is_folder,
        list_folder as list_folder,
        missing_in as missing_in,
        open_remote as open_remote,
    )
    from .session import current as current, remote_session as remote_session

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "counts": ("counts_remote", "with_remote"),
    "protocols": ("folder_bytes", "is_file", "is_folder", "list_folder", "missing_in", "open_remote"),
    "session": ("current", "remote_session"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "counts_remote", "current", "folder_bytes", "is_file", "is_folder", "list_folder", "missing_in", "open_remote",
    "remote_session", "with_remote",
]
