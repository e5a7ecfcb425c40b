"""The renames that publish an output, and the folder fsync that makes them durable.

Where Linux offers renameat2(2), a new output never overwrites one that
appeared meanwhile (RENAME_NOREPLACE) and a folder is swapped in one step
(RENAME_EXCHANGE); elsewhere the same guarantees come from a hard link or
a check just before the rename.
"""
from __future__ import annotations

import ctypes
import errno
import os

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def fsync_dir(path: str) -> None:
    """Make a rename or creation in ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # some platforms cannot open folders; the rename itself already happened
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _renameat2(a: str, b: str, flags: int) -> bool:
    """renameat2(2) where the C library has it; False where the call or the flag is unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)


def place_new(path: str, final: str, *, is_dir: bool) -> None:
    """Move ``path`` to ``final`` only if ``final`` does not exist (FileExistsError otherwise)."""
    if _renameat2(path, final, _RENAME_NOREPLACE):
        return
    if not is_dir:
        try:
            os.link(path, final)  # fails if final exists: no window for a race
        except FileExistsError:
            raise
        except OSError:
            pass  # no hard links here (some network file systems): check, then rename
        else:
            os.unlink(path)
            return
    if os.path.lexists(final):
        raise FileExistsError(errno.EEXIST, "exists", final)
    os.rename(path, final)


def exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)
