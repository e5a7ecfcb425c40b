"""Temporary outputs that name their writer, and the removal of those whose writer is gone.

A migrate killed with SIGKILL (the OOM killer, a preempted job) cannot
remove its hidden temporary output; on large outputs that fills disks.
So every temporary says who writes it, in its name::

    .NAME.ckpt-tmp-HHHHHHHH-PID-START-TTTTTTTT.EXT

HHHHHHHH is a hash of the writer's host name, PID its process id, START its
start time (clock ticks since boot, from /proc; 0 where unknown, so a
recycled pid is not mistaken for the writer) and TTTTTTTT a random token.
The writer also holds an advisory lock (``flock``) on the temporary, file
or folder, from its creation until it is renamed into place or removed.

A temporary is *stale*, and may be removed, only when all of these hold:

1. its name records an owner (older or foreign ``.ckpt-tmp-`` names are
   never removed: nothing proves their writer is gone);
2. the owner's host is this host (another host on a shared file system is
   never second-guessed: its pids mean nothing here);
3. the owner's process is gone: no such pid, a zombie, or a pid now used by
   a process that started at another time;
4. the lock can be taken (no process, in any pid namespace on this
   machine, or on another NFS client where locks reach the server, holds it).

The lock is held while the temporary is removed, so two cleaners never
race. Only this module knows the name format.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the name alone decides
    fcntl = None  # type: ignore[assignment]

TEMP_MARK = ".ckpt-tmp-"
_NAME_MAX = 255
_OWNED = re.compile(re.escape(TEMP_MARK) + r"(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-(?P<start>[0-9]{1,20})-"
                    r"(?P<token>[0-9a-f]{8})(?:\.[^.]*)?\Z")


@dataclass(frozen=True)
class Owner:
    """The process that created a temporary, as recorded in its name."""

    host: str  # 8 hex digits of a hash of the host name
    pid: int
    start: int  # clock ticks since boot when the process started; 0 = unknown
    token: str

    @property
    def this_host(self) -> bool:
        return self.host == host_tag()

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "this_host": self.this_host, "pid": self.pid, "start": self.start}


def host_tag(name: str | None = None) -> str:
    """8 hex digits standing for a host name (a full name would make file names too long)."""
    import hashlib  # here: 4 ms of OpenSSL that only the temporaries' names need

    if name is None:
        name = os.uname().nodename if hasattr(os, "uname") else _hostname()  # uname: gethostname's value
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _hostname() -> str:
    import socket

    return socket.gethostname()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return ("X", 0) if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


def own_start() -> int:
    got = _proc_stat(os.getpid())
    return got[1] if got is not None else 0


def owned_name(final: str, suffix: str = "") -> str:
    """A hidden sibling of ``final`` that keeps its extension and names this process as its writer."""
    folder, name = os.path.split(os.path.abspath(final))
    stem, ext = os.path.splitext(name)
    if suffix:
        ext = suffix
    tail = f"{TEMP_MARK}{host_tag()}-{os.getpid()}-{own_start()}-{os.urandom(4).hex()}{ext}"
    room = _NAME_MAX - 1 - len(os.fsencode(tail))
    while stem and len(os.fsencode(stem)) > room:  # a very long OUT name: shorten the stem, not the owner
        stem = stem[:-1]
    return os.path.join(folder, f".{stem}{tail}")


def owner_of(name: str) -> Owner | None:
    """The owner recorded in a temporary's file name; None for names that record none."""
    m = _OWNED.search(os.path.basename(name))
    if m is None:
        return None
    return Owner(m["host"], int(m["pid"]), int(m["start"]), m["token"])


def is_temporary(name: str) -> bool:
    """A ckpt temporary by its name: hidden, with the ``.ckpt-tmp-`` mark (owned or not)."""
    base = os.path.basename(name)
    return base.startswith(".") and TEMP_MARK in base


# ------------------------------------------------------------------ locks


class Lock:
    """An exclusive ``flock`` on a file or folder, held until ``release()``.

    ``flock`` belongs to the open file description, so the writer's other
    opens and closes of the same file (verification re-reads it) never
    release it, unlike POSIX record locks.
    """

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


def _open_for_lock(path: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    return os.open(path, flags)


def hold(path: str) -> Lock:
    """The writer's lock on its new temporary. Where the file system has no locks, an empty Lock:
    the name's owner record still protects the temporary on this host."""
    if fcntl is None:
        return Lock(None)
    try:
        fd = _open_for_lock(path)
    except OSError:
        return Lock(None)  # unlikely (we just created it); the owner record still protects it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return Lock(None)  # no locks on this file system (or a cleaner holds it this instant)
    return Lock(fd)


def _try_lock(path: str) -> tuple[str, Lock | None]:
    """("taken", lock) | ("busy", None) | ("gone", None) | ("unsupported", Lock(fd or None)).

    "unsupported": no lock can be tested here (a file system without locks, a
    file we may not open); rules 1-3 of the module docstring decide alone.
    """
    try:
        fd = _open_for_lock(path)
    except FileNotFoundError:
        return "gone", None
    except (PermissionError, IsADirectoryError):
        return "unsupported", Lock(None)
    except OSError:
        return "busy", None  # replaced by a link or something odd meanwhile: leave it
    if fcntl is None:
        return "unsupported", Lock(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _NO_LOCKS:
            return "unsupported", Lock(fd)
        os.close(fd)
        return "busy", None  # held (EWOULDBLOCK), or an error we cannot read as "free": leave it
    return "taken", Lock(fd)


# ------------------------------------------------------------------ liveness


def process_alive(pid: int, start: int) -> bool:
    """Whether the process that wrote ``pid`` and ``start`` may still run (True when unsure)."""
    if pid <= 0 or os.name == "nt":
        return True  # on Windows os.kill(pid, 0) would terminate the process: never probe there
    mine = True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        mine = False  # it exists, under another user (whose /proc entry hidepid may hide)
    except OSError:
        return True  # cannot tell (an odd platform): assume alive, remove nothing
    got = _proc_stat(pid)
    if got is None or (got[0] == "X" and not mine):
        return True  # no /proc (macOS), or it is hidden from us: the pid exists, which is all we can know
    state, started = got
    if state in ("Z", "X"):
        return False  # killed and not yet reaped by its parent: it writes nothing more
    # False: the pid now belongs to another process
    return not (start and started and started != start)


# ------------------------------------------------------------------ finding and removing


@dataclass(frozen=True)
class Temporary:
    """One temporary output found on disk, and what was decided about it."""

    path: str
    bytes: int
    owner: Owner | None
    verdict: str  # "stale" (removed, or would be with a dry run), "live", "other-host", "unowned", "in-use"
    reason: str
    removed: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "verdict": self.verdict, "reason": self.reason,
                "removed": self.removed, "error": self.error,
                "owner": self.owner.to_json() if self.owner is not None else None}


@dataclass(frozen=True)
class CleanReport:
    """What a search for stale temporaries found, removed and left alone."""

    folder: str
    recursive: bool
    dry_run: bool
    found: tuple[Temporary, ...] = field(default_factory=tuple)

    @property
    def removed(self) -> tuple[Temporary, ...]:
        return tuple(t for t in self.found if t.removed)

    @property
    def stale(self) -> tuple[Temporary, ...]:
        return tuple(t for t in self.found if t.verdict == "stale")

    @property
    def failed(self) -> tuple[Temporary, ...]:
        return tuple(t for t in self.found if t.error is not None)

    @property
    def kept(self) -> tuple[Temporary, ...]:
        return tuple(t for t in self.found if t.verdict != "stale")

    @property
    def bytes_freed(self) -> int:
        return sum(t.bytes for t in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.folder, "recursive": self.recursive, "dry_run": self.dry_run,
                "removed": [t.to_json() for t in self.removed],
                "stale": [t.to_json() for t in self.stale],
                "kept": [t.to_json() for t in self.kept],
                "failed": [t.to_json() for t in self.failed],
                "bytes_freed": self.bytes_freed}


def _size(path: str, st: os.stat_result) -> int:
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # vanished while we looked: it no longer takes space
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _candidates(folder: str, recursive: bool) -> Iterator[tuple[str, os.stat_result]]:
    """Temporaries under ``folder``: plain files and folders only (a symlink is never ours)."""
    stack = [folder]
    while stack:
        here = stack.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue  # unreadable or vanished: nothing of ours can be listed there
        for entry in entries:
            if is_temporary(entry.name):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # vanished meanwhile
                if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    yield entry.path, st
                continue  # never look inside a temporary folder
            try:
                if recursive and entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
            except OSError:
                continue  # vanished or unreadable: nothing of ours to find there


def _judge(path: str) -> tuple[str, str, Owner | None]:
    """(verdict, reason, owner), before the lock is tried."""
    owner = owner_of(path)
    if owner is None:
        return ("unowned", "no owner recorded in the name (an older ckpt, or a report file); "
                "delete it by hand once no ckpt runs", None)
    if not owner.this_host:
        return ("other-host", f"written on another host (tag {owner.host}); run `ckpt doctor --clean` there", owner)
    if process_alive(owner.pid, owner.start):
        return "live", f"its writer, pid {owner.pid}, is still running", owner
    return "stale", f"its writer, pid {owner.pid}, has exited", owner


def _remove(path: str, is_dir: bool) -> None:
    if is_dir:
        import shutil

        shutil.rmtree(path)
    else:
        os.unlink(path)


def examine(path: str, st: os.stat_result, *, dry_run: bool) -> Temporary:
    """Decide about one temporary, and remove it when it is stale (unless ``dry_run``)."""
    size = _size(path, st)
    verdict, reason, owner = _judge(path)
    if verdict != "stale":
        return Temporary(path, size, owner, verdict, reason)
    state, lock = _try_lock(path)
    if state == "gone":
        return Temporary(path, 0, owner, "in-use", "removed by someone else meanwhile")
    if state == "busy":
        return Temporary(path, size, owner, "in-use", "another process holds its lock")
    try:
        if not _unchanged(path, st, lock.fd if lock is not None else None):
            return Temporary(path, size, owner, "in-use", "replaced meanwhile")
        if dry_run:
            return Temporary(path, size, owner, "stale", reason)
        try:
            _remove(path, stat.S_ISDIR(st.st_mode))
        except FileNotFoundError:
            return Temporary(path, 0, owner, "in-use", "removed by someone else meanwhile")
        except OSError as exc:
            return Temporary(path, size, owner, "stale", reason, error=exc.strerror or str(exc))
        return Temporary(path, size, owner, "stale", reason, removed=True)
    finally:
        if lock is not None:
            lock.release()


def _unchanged(path: str, st: os.stat_result, fd: int | None) -> bool:
    """``path`` is still the file or folder found (and, with ``fd``, the one locked)."""
    try:
        now = os.lstat(path)
        held = os.fstat(fd) if fd is not None else now
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def clean(folder: str, *, recursive: bool = False, dry_run: bool = False) -> CleanReport:
    """Find ckpt temporaries in ``folder`` (and below it with ``recursive``) and remove the stale ones.

    Never raises for what it finds: each temporary's verdict, reason and any
    removal error is in the report.
    """
    folder = os.path.abspath(folder)
    found = tuple(examine(p, st, dry_run=dry_run) for p, st in _candidates(folder, recursive))
    return CleanReport(folder, recursive, dry_run, found)
