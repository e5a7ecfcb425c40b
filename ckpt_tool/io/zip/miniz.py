"""Which zip member torch's reader finds for a name: miniz's sorted index and binary search, replayed.

torch reads archives with miniz, which sorts the central directory by
lower-cased name with an (unstable) heap sort, then finds a name by binary
search, ignoring ASCII case. For an archive whose names are unique that is
simply "the member of that name"; when two entries share a name (or differ
only in case), the one miniz lands on is neither the first nor the last in
general, so ckpt replays miniz's exact steps to read the member torch reads.
"""
from __future__ import annotations

from collections.abc import Iterable


def _lower(name: str) -> bytes:
    return bytes(c + 32 if 65 <= c <= 90 else c for c in name.encode("utf-8", "surrogateescape"))


def case_twins(names: Iterable[str]) -> bool:
    """Two names that differ only in case (``data.pkl``, ``DATA.PKL``): miniz may find either for both.

    Python's Unicode folding is a superset of miniz's ASCII one, so no twin is missed (a false one only
    costs the exact replay).
    """
    joined = "\n".join(names)
    low = joined.lower()
    return low != joined and len(set(low.split("\n"))) != joined.count("\n") + 1


class MinizIndex:
    """``mz_zip_reader_sort_central_dir_offsets_by_filename`` + ``mz_zip_locate_file_binary_search``."""

    def __init__(self, names: list[str]) -> None:
        self._keys = [_lower(n) for n in names]
        self._sorted = self._heap_sort(len(names))

    def _less(self, a: int, b: int) -> bool:
        return self._keys[a] < self._keys[b]  # byte-wise, a proper prefix first: as mz_zip_reader_filename_less

    def _sift(self, idx: list[int], root: int, end: int) -> None:
        while True:
            child = (root << 1) + 1
            if child >= end:
                return
            if child + 1 < end and self._less(idx[child], idx[child + 1]):
                child += 1
            if not self._less(idx[root], idx[child]):
                return
            idx[root], idx[child] = idx[child], idx[root]
            root = child

    def _heap_sort(self, size: int) -> list[int]:
        idx = list(range(size))
        if size <= 1:
            return idx
        start = (size - 2) >> 1
        while True:
            self._sift(idx, start, size)
            if not start:
                break
            start -= 1
        end = size - 1
        while end > 0:
            idx[end], idx[0] = idx[0], idx[end]
            self._sift(idx, 0, end)
            end -= 1
        return idx

    def locate(self, name: str) -> int | None:
        """The central-directory position miniz finds for ``name`` (ASCII case ignored), or None."""
        key = _lower(name)
        lo, hi = 0, len(self._sorted) - 1
        while lo <= hi:
            mid = lo + ((hi - lo) >> 1)
            found = self._keys[self._sorted[mid]]
            if found == key:
                return self._sorted[mid]
            if found < key:
                lo = mid + 1
            else:
                hi = mid - 1
        return None
