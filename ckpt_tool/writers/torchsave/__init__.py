"""The torch.save zip format written without torch: the archive, ``data.pkl``, inert records, --sanitize."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .datapkl import StorageTable as StorageTable, as_meta as as_meta, make_state_dict as make_state_dict
    from .subclass import written_device as written_device
    from .writer import TorchZipWriter as TorchZipWriter

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "datapkl": ("StorageTable", "as_meta", "make_state_dict"),
    "subclass": ("written_device",),
    "writer": ("TorchZipWriter",),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = ["StorageTable", "TorchZipWriter", "as_meta", "make_state_dict", "written_device"]
