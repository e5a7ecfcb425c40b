"""Folders and the smaller containers the scanner opens: tar, NumPy .npy, DCP data files."""
from __future__ import annotations

import ast
import os
import struct
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .blob import Blob
from .errors import CkptError, InputError
from .unpickle import Limits


@dataclass(frozen=True)
class Region:
    """One item of a DCP data file: where torch.load will read it from."""

    fqn: str
    offset: int
    length: int
    is_bytes: bool  # a non-tensor item, loaded with torch.load(weights_only=False)
    transformed: bool  # compressed or otherwise transformed on save: its bytes are not a pickle


def scan_folder(path: str, limits: Limits) -> tuple[list[Any], list[str]]:
    """Scan every file under ``path`` (hidden ones too); list those that hold nothing to scan."""
    from .scan import DCP_DATA, scan_file

    files: list[Any] = []
    skipped: list[str] = []
    for root, dirs, names in os.walk(path, onerror=None):
        dirs.sort()
        regions: dict[str, list[Region]] | None = None
        if ".metadata" in names:
            regions = dcp_regions(os.path.join(root, ".metadata"))
        for name in sorted(names):
            full = os.path.join(root, name)
            if name.endswith(".distcp") and ".metadata" in names:
                if regions is not None:
                    result = scan_file(full, limits=limits, regions=regions.get(name, []))
                else:  # the metadata could not be read: look for embedded archives everywhere
                    result = scan_file(full, limits=limits, hint=DCP_DATA)
            else:
                result = scan_file(full, limits=limits, explicit=False)
            if result is None:
                skipped.append(full)
            else:
                files.append(result)
    return files, skipped


def dcp_regions(metadata_path: str) -> dict[str, list[Region]] | None:
    """The items of each ``.distcp`` file, read from ``.metadata`` with the restricted unpickler."""
    from .unpickle import Placeholder, restricted_loads

    try:
        with open(metadata_path, "rb") as f:
            data = f.read(1 << 30)
        root = restricted_loads(data, where=".metadata", path=metadata_path).obj
    except (OSError, CkptError):
        return None
    if not isinstance(root, Placeholder):
        return None
    attrs = root.attributes
    md = attrs.get("state_dict_metadata")
    storage = attrs.get("storage_data")
    if not isinstance(md, Mapping) or not isinstance(storage, Mapping):
        return None
    out: dict[str, list[Region]] = {}
    for index, info in storage.items():
        if not isinstance(index, Placeholder) or not isinstance(info, Placeholder):
            return None
        fqn = index.attributes.get("fqn")
        i = info.attributes
        rel, offset, length = i.get("relative_path"), i.get("offset"), i.get("length")
        if not (isinstance(rel, str) and isinstance(offset, int) and isinstance(length, int)):
            return None
        item = md.get(fqn)
        is_bytes = isinstance(item, Placeholder) and item._ckpt_name == "BytesStorageMetadata"
        out.setdefault(rel, []).append(
            Region(str(fqn), offset, length, is_bytes, bool(i.get("transform_descriptors"))))
    return out


def tar_members(blob: Blob) -> list[tuple[str, Blob]] | None:
    """Regular members of a tar archive (torch's oldest format), or None if it is not one."""
    if blob.length < 512:
        return None
    head = blob.read(0, 512)
    if head[257:262] != b"ustar" and not _tar_checksum_ok(head):
        return None
    try:
        with tarfile.open(fileobj=blob.stream(), mode="r:") as tar:
            return [(m.name, blob.sub(m.offset_data, m.size)) for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, EOFError, OSError, ValueError):
        # not a tar after all (or a corrupt one torch would refuse too)
        return None


def _tar_checksum_ok(head: bytes) -> bool:
    try:
        stored = int(head[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(head[:148]) + 256 + sum(head[156:512])


def npy_pickle_offset(blob: Blob) -> int | None:
    """Where the pickled data of an object-dtype ``.npy`` starts; None for plain arrays."""
    head = blob.read(0, 12)
    if len(head) < 10:
        raise InputError("truncated .npy header")
    major = head[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", head, 8)
        start = 10
    elif major in (2, 3):
        (hlen,) = struct.unpack_from("<I", head, 8)
        start = 12
    else:
        raise InputError(f"unknown .npy version {major}")
    if hlen > 1 << 20:
        raise InputError(".npy header is too large")
    text = blob.read(start, hlen).decode("latin-1")
    try:
        header = ast.literal_eval(text)  # a literal only: ast never evaluates code
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise InputError(f"bad .npy header: {exc}") from None
    if not isinstance(header, dict) or "descr" not in header:
        raise InputError("bad .npy header: no 'descr'")
    return start + hlen if _has_object(header["descr"]) else None


def _has_object(descr: object) -> bool:
    if isinstance(descr, str):
        return descr.lstrip("<>|=")[:1] == "O"
    if isinstance(descr, (list, tuple)):
        return any(_has_object(d) for d in descr)
    return False
