"""Writing outputs so that a crash, a full disk or Ctrl-C never leaves a partial file.

Every output is written to a temporary name beside its final path (same
folder, so the rename cannot cross file systems), fsynced, verified, then
renamed into place and the folder fsynced. Until the rename, the old output
(if any) is untouched; on any error or interrupt the temporary is removed.
Folder outputs (sharded sets, DCP) are built in a temporary folder and
swapped in whole. Temporaries name their writer and stay locked while it
lives, so those a SIGKILL leaves behind can be told apart and removed
(staletemp.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Iterator

from ..errors import OutputExists, UsageError, WriteError
from . import staletemp

TEMP_MARK = staletemp.TEMP_MARK


class Terminated(KeyboardInterrupt):
    """SIGTERM/SIGHUP arrived while writing; handled like Ctrl-C so temporaries are removed."""


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


def temp_name(final: str, suffix: str = "") -> str:
    """A hidden sibling of ``final`` that keeps its extension (readers warn on odd ones) and
    names this process as its writer."""
    return staletemp.owned_name(final, suffix)


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_destination(out: str, sources: Iterable[str], *, force: bool, folder: bool) -> None:
    """Refuse outputs that would overwrite SRC or an existing output; called before any write."""
    out_real = _real(out)
    parent = os.path.dirname(os.path.abspath(out))
    srcs = [s for s in sources if s]
    for src in srcs:
        src_real = _real(src)
        if out_real == src_real or _same_file(out, src):
            raise UsageError(f"the output {out} is the source {src} (or a link to it): ckpt never "
                             "modifies its input; write to a new path")
        if folder and (src_real + os.sep).startswith(out_real.rstrip(os.sep) + os.sep):
            raise UsageError(f"the output folder {out} holds the source {src}: replacing it would delete "
                             "the input; write to a new folder")
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {out}: the folder {parent} does not exist")
    if not os.path.lexists(out):
        return
    if not force:
        what = "folder" if os.path.isdir(out) else "file"
        raise OutputExists(f"the output {what} {out} exists; pass --force to replace it "
                           "(it is replaced only after the new output is complete and verified)")
    if folder and not os.path.isdir(out):
        raise UsageError(f"the output {out} is a file but this format writes a folder")
    if not folder and os.path.isdir(out) and not os.path.islink(out):
        raise UsageError(f"the output {out} is a folder; give a file name (e.g. {out.rstrip('/')}/model.pth)")


def check_replaceable_folder(out: str, allowed_suffixes: tuple[str, ...]) -> None:
    """--force replaces a folder only if it holds nothing but files of the kind ckpt writes there.

    A model folder that also holds config.json or tokenizer files is never wiped.
    """
    if not os.path.isdir(out):
        return
    foreign = []
    for root, _dirs, files in os.walk(out):
        rel = os.path.relpath(root, out)
        if rel != ".":
            foreign.append(rel + os.sep)
            continue
        foreign.extend(name for name in files if not name.endswith(allowed_suffixes))
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise UsageError(f"refusing to replace the folder {out}: it holds files ckpt does not write there "
                         f"({shown}); choose a new folder")


@contextlib.contextmanager
def interrupts_as_exceptions() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception while writing, so cleanup runs (SIGKILL cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        try:
            previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):
            pass  # not allowed here (embedded interpreter): the default action stays
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


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


class _Temporary:
    """What AtomicFile and AtomicDir share: leaving the block unpublished removes the temporary."""

    published: bool
    final: str
    _lock: staletemp.Lock

    def discard(self) -> None:
        raise NotImplementedError

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

    def __enter__(self) -> AtomicFile:
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise _write_error(exc, self.final) from None
        self._lock = staletemp.hold(self.path)  # until published or removed: it marks a live writer
        return self

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
                _place_new(self.path, self.final, is_dir=False)
        except FileExistsError:
            raise _exists(self.final) from None
        except OSError as exc:
            raise _write_error(exc, self.final) from None
        self.published = True
        fsync_dir(os.path.dirname(self.final))

    def discard(self) -> None:
        try:
            self._wait()
        except (OSError, WriteError):
            pass  # the file is being removed; why its fsync failed no longer matters
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)



_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exists(final: str) -> OutputExists:
    return OutputExists(f"the output {final} appeared while this migration ran (another job?); it was left as it "
                        "was and nothing was written; pass --force to replace it")


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


def _place_new(path: str, final: str, *, is_dir: bool) -> None:
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


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


class AtomicDir(_Temporary):
    """A temporary folder beside ``final`` that replaces it whole when published.

    An existing ``final`` (with --force) is swapped out only after the new
    folder is complete and fsynced, then deleted.
    """

    def __init__(self, final: str) -> None:
        self.final = os.path.abspath(final.rstrip("/") or final)
        self.path = temp_name(self.final, suffix=".d")
        self.published = False
        self._sync: _Background | None = None
        self._lock = staletemp.Lock(None)

    def __enter__(self) -> AtomicDir:
        try:
            os.mkdir(self.path, 0o700)
        except OSError as exc:
            raise _write_error(exc, self.final) from None
        self._lock = staletemp.hold(self.path)  # until published or removed: it marks a live writer
        return self

    def create(self, name: str) -> int:
        """A new file in the folder, open for writing."""
        try:
            return os.open(os.path.join(self.path, name),
                           os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
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
                _place_new(self.path, self.final, is_dir=True)
                self.published = True
                fsync_dir(parent)
                return
            if os.path.lexists(self.final):
                if _exchange(self.path, self.final):
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
        try:
            self._wait()
        except (OSError, WriteError):
            pass  # the folder is being removed; why its fsync failed no longer matters
        shutil.rmtree(self.path, ignore_errors=True)

