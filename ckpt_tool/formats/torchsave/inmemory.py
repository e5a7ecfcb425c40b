"""torch.save bytes held in memory: nested inside a pickle, or one DCP chunk.

``pickle.dump(tensor)`` writes each storage as ``torch.storage._load_from_bytes(b)``
where ``b`` is a whole (legacy-format) torch.save blob, and every tensor chunk
of a torch.distributed.checkpoint shard is a torch.save zip. Both are parsed
here with the same restricted readers as files on disk (never torch.load).
"""
from __future__ import annotations

from typing import Any

from ...errors import InputError
from ...io import BytesStorageSource
from ...io.zip import ZipArchive
from ...limits import Limits
from ...model import GlobalRef
from ...pickles.unpickle import restricted_loads


def read_torch_blob(blob: bytes, *, path: str, where: str, limits: Limits) -> tuple[Any, list[GlobalRef]]:
    """(object, globals it names) for torch.save bytes, zip or legacy, read lazily."""
    if blob.startswith(b"PK\x03\x04"):
        return _read_zip_blob(blob, path, where, limits)
    from .legacy import parse_legacy_bytes

    parsed = parse_legacy_bytes(blob, path=path, where=where, limits=limits, read_blob=read_torch_blob)
    return parsed.root, parsed.references


def _read_zip_blob(blob: bytes, path: str, where: str, limits: Limits) -> tuple[Any, list[GlobalRef]]:
    from .archive import archive_prefix, check_version, storage_loader

    archive = ZipArchive(path, limits.max_member_bytes, data=blob)
    prefix = archive_prefix(archive)
    check_version(archive, prefix)
    pkl = archive.resolve(prefix + "data.pkl")
    if pkl is None:
        raise InputError(f"{where} is a zip archive without {prefix + 'data.pkl'!r}, not torch.save bytes", path)
    source = BytesStorageSource(path, blob, archive.region)
    data = archive.read(pkl, limits.max_pickle_bytes)
    result = restricted_loads(
        data, where=f"{where}/{pkl}", path=path,
        persistent_load=storage_loader(archive, prefix, source, path),
        limits=limits, read_blob=read_torch_blob,
    )
    return result.obj, list(result.references)
