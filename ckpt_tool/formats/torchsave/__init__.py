"""torch.save files in every form (zip, legacy, tar, TorchScript), plain pickle and dill, and ``--unsafe`` loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .archive import (
        archive_prefix as archive_prefix,
        read_torch_zip as read_torch_zip,
        storage_loader as storage_loader,
    )
    from .inmemory import read_torch_blob as read_torch_blob
    from .unsafe import read_unsafe as read_unsafe

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "archive": ("archive_prefix", "read_torch_zip", "storage_loader"),
    "inmemory": ("read_torch_blob",),
    "unsafe": ("read_unsafe",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["archive_prefix", "read_torch_blob", "read_torch_zip", "read_unsafe", "storage_loader"]
