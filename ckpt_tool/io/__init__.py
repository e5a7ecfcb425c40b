
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .bytesource import ByteSource as ByteSource
    from .bytesource import is_url as is_url
    from .containers import (
        LEGACY_MAGIC as LEGACY_MAGIC,
    )
    from .containers import (
        is_legacy_magic as is_legacy_magic,
    )
    from .containers import (
        literal_npy_offset as literal_npy_offset,
    )
    from .containers import (
        npy_header as npy_header,
    )
    from .containers import (
        npy_pickle_offset as npy_pickle_offset,
    )
    from .containers import (
        safetensors_header_length as safetensors_header_length,
    )
    from .containers import (
        tar_members as tar_members,
    )
    from .paths import (
        basename as basename,
    )
    from .paths import (
        count_remote as count_remote,
    )
    from .paths import (
        dirname as dirname,
    )
    from .paths import (
        isdir as isdir,
    )
    from .paths import (
        isfile as isfile,
    )
    from .paths import (
        join as join,
    )
    from .paths import (
        listdir as listdir,
    )
    from .paths import (
        open_bytes as open_bytes,
    )
    from .paths import (
        remote_session as remote_session,
    )
    from .paths import (
        url_bytes as url_bytes,
    )
    from .regions import Blob as Blob
    from .regions import window as window
    from .segments import Part as Part
    from .segments import Segment as Segment
    from .segments import SegmentSource as SegmentSource
    from .segments import concat_slice as concat_slice
    from .source import (
        BytesStorageSource as BytesStorageSource,
    )
    from .source import (
        FileSource as FileSource,
    )
    from .source import (
        MemorySource as MemorySource,
    )
    from .source import (
        RangeSource as RangeSource,
    )
    from .source import (
        pread_exact as pread_exact,
    )
    from .source import (
        read_pickle_file as read_pickle_file,
    )
    from .source import (
        storage_source as storage_source,
    )
    from .tree import Link as Link
    from .tree import first_unreadable as first_unreadable
    from .tree import walk as walk

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "bytesource": ("ByteSource", "is_url"),
    "containers": (
        "LEGACY_MAGIC", "is_legacy_magic", "literal_npy_offset", "npy_header", "npy_pickle_offset",
        "safetensors_header_length", "tar_members",
    ),
    "paths": (
        "basename", "count_remote", "dirname", "isdir", "isfile", "join", "listdir", "open_bytes", "remote_session",
        "url_bytes",
    ),
    "regions": ("Blob", "window"),
    "segments": ("Part", "Segment", "SegmentSource", "concat_slice"),
    "source": (
        "BytesStorageSource", "FileSource", "MemorySource", "RangeSource", "pread_exact", "read_pickle_file",
        "storage_source",
    ),
    "tree": ("Link", "first_unreadable", "walk"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "LEGACY_MAGIC",
    "Blob",
    "ByteSource",
    "BytesStorageSource",
    "FileSource",
    "Link",
    "MemorySource",
    "Part",
    "RangeSource",
    "Segment",
    "SegmentSource",
    "basename",
    "concat_slice",
    "count_remote",
    "dirname",
    "first_unreadable",
    "is_legacy_magic",
    "is_url",
    "isdir",
    "isfile",
    "join",
    "listdir",
    "literal_npy_offset",
    "npy_header",
    "npy_pickle_offset",
    "open_bytes",
    "paths",
    "pread_exact",
    "read_pickle_file",
    "remote_session",
    "safetensors_header_length",
    "storage_source",
    "tar_members",
    "url_bytes",
    "walk",
    "window",
]
