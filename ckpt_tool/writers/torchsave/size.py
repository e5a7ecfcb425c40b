"""How large a torch zip archive will be, replayed exactly from the plan (padding and ZIP64 records included)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from ..payload import TorchPayload

if TYPE_CHECKING:
    from .datapkl import StorageTable

def _zip_size(members: Sequence[tuple[int, int]]) -> int:
    """The exact size of the archive ``torchzip.ZipWriter`` writes for (length of the full member name in
    bytes, size) pairs."""
    from . import archive as torchzip

    limit = torchzip.ZIP64_LIMIT  # read at call time: tests lower it
    align = torchzip.ALIGNMENT
    count = len(members)
    names = sum(n for n, _ in members)
    if sum(size for _, size in members) + count * (34 + align) + names < limit:
        pos = 0  # no ZIP64 record anywhere (the usual case): only the alignment padding varies
        for name_len, size in members:
            start = pos + 34 + name_len
            pos = start - start % -align + size
        directory = 46 * count + names
    else:
        pos = directory = 0
        for name_len, size in members:
            zip64 = size >= limit
            start = pos + 34 + name_len + (20 if zip64 else 0)
            fields = (2 if zip64 else 0) + (1 if pos >= limit else 0)
            pos = start + -start % align + size
            directory += 46 + name_len + (4 + 8 * fields if fields else 0)
    end = 22
    if count >= min(0xFFFF, limit) or directory >= limit or pos >= limit:
        end += 56 + 20
    return pos + directory + end


def torch_zip_size(out: str, data_pkl: bytes, table: StorageTable) -> int:
    from .archive import ALIGNMENT, archive_name

    base = len(archive_name(out).encode("utf-8")) + 1
    named = [("data.pkl", len(data_pkl)), (".format_version", 1), (".storage_alignment", len(str(ALIGNMENT))),
             ("byteorder", len(sys.byteorder))]
    members = [(base + len(name), size) for name, size in named]
    data = base + len("data/")  # storage keys are ASCII digits
    members += [(data + len(st.key), st.nbytes) for st in table.storages]
    members += [(base + len("version"), 2), (base + len(".data/serialization_id"), 40)]
    return _zip_size(members)


def bound(out: str, payload: TorchPayload) -> tuple[int, int]:
    """(at least the total bytes, 1 file) of the archive, from sums alone."""
    from .archive import archive_name

    storages = payload.table.storages
    # local header + central record: the name twice, ZIP64 extras, at most 63 bytes of padding
    per_member = 2 * (len(archive_name(out).encode("utf-8")) + 32) + 191
    return (sum(map(attrgetter("nbytes"), storages)) + len(payload.data_pkl) + (len(storages) + 6) * per_member
            + 98, 1)
