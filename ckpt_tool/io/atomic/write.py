"""Writing outputs so that a crash, a full disk or Ctrl-C never leaves a partial file.

Every output is written to a temporary name beside its final path (same
folder, so the rename cannot cross file systems), fsynced, verified, then
renamed into place and the folder fsynced. Until the rename, the old output
(if any) is untouched; on any error or interrupt the temporary is removed.
Folder outputs (sharded sets, DCP) are built in a temporary folder and
swapped in whole. Temporaries name their writer and stay locked while it
lives, so those a SIGKILL leaves behind can be told apart and removed
(staletemp.py).

Creating a temporary and locking it is one step (``_create_locked``): an
interrupt that arrives in between is held back until both are done and the
``with`` block owns the temporary, so Ctrl-C at any moment removes it.

Checking where an output may go is destination.py; the renames themselves
and the folder fsync are renames.py; SIGTERM handling is interrupts.py.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections.abc import Callable
from typing import TypeVar

from ...errors import OutputExists, WriteError
from . import staletemp
from .interrupts import deferred_interrupts
from .renames import exchange, fsync_dir, place_new

TEMP_MARK = staletemp.TEMP_MARK
_T = TypeVar("_T", bound="_Temporary")


def current_umask() -> int:
    """The process umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass  # not Linux, or an old kernel: fall back to the set-and-restore dance
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """0644 minus the umask: what ``torch.save`` gives under the usual umask (not 0600)."""
    return 0o644 & ~current_umask()


def dir_mode() -> int:
    return 0o755 & ~current_umask()


def temp_name(final: str, suffix: str = "") -> str:
    """A hidden sibling of ``final`` that keeps its extension (readers warn on odd ones) and
    names this process as its writer."""
    return staletemp.owned_name(final, suffix)


def _write_error(exc: OSError, path: str) -> WriteError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on the device"
    elif exc.errno == errno.EFBIG:
        reason = "file too large for this file system or the process file-size limit"
    elif exc.errno in (errno.EROFS,):
        reason = "the file system is read-only"
    return WriteError(f"cannot write: {reason}; nothing was left behind", path)


class _Background:
    """Runs one function in a thread; ``wait()`` joins it and re-raises what it raised."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to wait(), which re-raises it
                self._error = exc

        self._thread = threading.Thread(target=run, name="ckpt-fsync", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _remove(path: str, folder: bool) -> None:
    if folder:
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _create_locked(path: str, final: str, folder: bool) -> tuple[int | None, staletemp.Lock]:
    """Create the temporary ``path`` (a file open for writing, or a folder) and lock it, or leave nothing.

    If taking the lock fails in any way (an exception, KeyboardInterrupt
    included), the new temporary is removed before the error goes on.
    """
    try:
        if folder:
            os.mkdir(path, 0o700)
            fd = None
        else:
            fd = os.open(path, _CREATE_FLAGS, 0o600)
    except OSError as exc:
        raise _write_error(exc, final) from None  # nothing was created
    try:
        return fd, staletemp.hold(path)  # until published or removed: it marks a live writer
    except BaseException:
        if fd is not None:
            os.close(fd)
        _remove(path, folder)
        raise


class _Temporary:
    """What AtomicFile and AtomicDir share: leaving the block unpublished removes the temporary."""

    published: bool
    final: str
    path: str
    _lock: staletemp.Lock
    _folder: bool = False
    fd: int | None = None  # AtomicFile: the temporary, open for writing (AtomicDir: always None)

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        """Create and lock the temporary as one step (see ``_create_locked``).

        Signals are held back while it runs, so an interrupt lands either
        before anything exists or once this object holds the temporary; in
        the second case it is removed here, as ``__exit__`` would (Python
        calls no ``__exit__`` for a ``with`` whose ``__enter__`` raised).
        """
        created = False
        try:
            with deferred_interrupts():
                self.fd, self._lock = _create_locked(self.path, self.final, self._folder)
                created = True
            return self  # no interrupt can land between here and the with block that owns it
        except BaseException:
            if created:
                with deferred_interrupts():  # a second Ctrl-C waits until the temporary is gone
                    try:
                        self.discard()
                    finally:
                        self._lock.release()
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if not self.published:
                self.discard()
        finally:
            self._lock.release()
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise _write_error(exc, self.final) from exc


class AtomicFile(_Temporary):
    """A temporary file beside ``final`` that becomes ``final`` only when published.

    ``finish()`` fsyncs and closes it (then it can be verified by path);
    ``publish()`` renames it into place and fsyncs the folder. Leaving the
    ``with`` block without publishing removes it.
    """

    def __init__(self, final: str) -> None:
        self.final = os.path.abspath(final)
        self.path = temp_name(self.final)
        self.fd: int | None = None
        self.published = False
        self._sync: _Background | None = None
        self._lock = staletemp.Lock(None)
        self.mode = file_mode()
        if os.path.isfile(self.final):
            # replacing with --force keeps the old file's permissions, as editing it in place would
            self.mode = stat.S_IMODE(os.stat(self.final).st_mode)

    def finish(self, background: bool = False) -> None:
        """Flush to disk and close; the bytes are final from here on.

        With ``background`` the fsync runs while the caller verifies the
        file (reading it back needs no fsync); publishing waits for it.
        """
        if background:
            self._sync = _Background(self.finish)
            return
        if self.fd is None:
            return
        try:
            os.fchmod(self.fd, self.mode)
            os.fsync(self.fd)
        except OSError as exc:
            raise _write_error(exc, self.final) from None
        finally:
            os.close(self.fd)
            self.fd = None

    def _wait(self) -> None:
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.wait()

    def publish(self, replace: bool = True) -> None:
        """Rename into place. Without ``replace`` an output that appeared meanwhile
        (another job writing the same OUT) is never overwritten: it is an error.
        """
        self._wait()
        self.finish()
        try:
            if replace:
                os.replace(self.path, self.final)
            else:
                place_new(self.path, self.final, is_dir=False)
        except FileExistsError:
            raise _exists(self.final) from None
        except OSError as exc:
            raise _write_error(exc, self.final) from None
        self.published = True
        fsync_dir(os.path.dirname(self.final))

    def discard(self) -> None:
        with contextlib.suppress(OSError, WriteError):  # the file is being removed; why its fsync failed is moot
            self._wait()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _exists(final: str) -> OutputExists:
    return OutputExists(f"the output {final} appeared while this migration ran (another job?); it was left as it "
                        "was and nothing was written; pass --force to replace it")


class AtomicDir(_Temporary):
    """A temporary folder beside ``final`` that replaces it whole when published.

    An existing ``final`` (with --force) is swapped out only after the new
    folder is complete and fsynced, then deleted.
    """

    def __init__(self, final: str) -> None:
        self.final = os.path.abspath(final.rstrip("/") or final)
        self.path = temp_name(self.final, suffix=".d")
        self._folder = True
        self.published = False
        self._sync: _Background | None = None
        self._lock = staletemp.Lock(None)

    def create(self, name: str) -> int:
        """A new file in the folder, open for writing."""
        try:
            return os.open(os.path.join(self.path, name), _CREATE_FLAGS, 0o600)
        except OSError as exc:
            raise _write_error(exc, self.final) from None

    def finish(self, background: bool = False) -> None:
        """fsync every file and the folder, and give them their final permissions."""
        if background:
            self._sync = _Background(self.finish)
            return
        try:
            for root, dirs, files in os.walk(self.path):
                for name in files:
                    p = os.path.join(root, name)
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        os.fchmod(fd, file_mode())
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                for name in dirs:
                    os.chmod(os.path.join(root, name), dir_mode())
                fsync_dir(root)
            os.chmod(self.path, dir_mode())
        except OSError as exc:
            raise _write_error(exc, self.final) from None

    def _wait(self) -> None:
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.wait()

    def publish(self, replace: bool = True) -> None:
        if self._sync is not None:
            self._wait()
        else:
            self.finish()
        parent = os.path.dirname(self.final)
        try:
            if not replace:
                place_new(self.path, self.final, is_dir=True)
                self.published = True
                fsync_dir(parent)
                return
            if os.path.lexists(self.final):
                if exchange(self.path, self.final):
                    self.published = True
                    fsync_dir(parent)
                    shutil.rmtree(self.path, ignore_errors=True)  # now holds the old set
                    return
                old = temp_name(self.final, suffix=".old")
                os.rename(self.final, old)
                try:
                    os.rename(self.path, self.final)
                except OSError:
                    os.rename(old, self.final)  # put the old set back
                    raise
                self.published = True
                fsync_dir(parent)
                shutil.rmtree(old, ignore_errors=True)
                return
            os.rename(self.path, self.final)
            self.published = True
            fsync_dir(parent)
        except FileExistsError:
            raise _exists(self.final) from None
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                raise _exists(self.final) from None
            raise _write_error(exc, self.final) from None

    def discard(self) -> None:
        with contextlib.suppress(OSError, WriteError):  # the folder is being removed; why its fsync failed is moot
            self._wait()
        shutil.rmtree(self.path, ignore_errors=True)

