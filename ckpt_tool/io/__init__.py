
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .bytesource import ByteSource as ByteSource, is_url as is_url
    from .containers import (
        LEGACY_MAGIC as LEGACY_MAGIC,
        is_legacy_magic as is_legacy_magic,
        literal_npy_offset as literal_npy_offset,
        npy_header as npy_header,
        npy_pickle_offset as npy_pickle_offset,
        safetensors_header_length as safetensors_header_length,
        tar_members as tar_members,
    )
    from .paths import (
        basename as basename,
        count_remote as count_remote,
        dirname as dirname,
        isdir as isdir,
        isfile as isfile,
        join as join,
        listdir as listdir,
        open_bytes as open_bytes,
        remote_session as remote_session,
        url_bytes as url_bytes,
    )
    from .regions import Blob as Blob, window as window
    from .segments import Part as Part, Segment as Segment, SegmentSource as SegmentSource, concat_slice as concat_slice
    from .source import (
        BytesStorageSource as BytesStorageSource,
        FileSource as FileSource,
        MemorySource as MemorySource,
        RangeSource as RangeSource,
        pread_exact as pread_exact,
        read_pickle_file as read_pickle_file,
        storage_source as storage_source,
    )
    from .tree import Link as Link, first_unreadable as first_unreadable, walk as walk

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
