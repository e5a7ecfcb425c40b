"""URLs: the session a command reads them in, and the errors reading them raises.

A Session (a context variable) holds the files opened in it
(remotefile.RemoteFile: a few range requests for metadata, parallel ranges
for data), the request and byte counts (``remote: {requests, bytes}`` in
--json) and whether a server that ignores Range may be downloaded whole
(``--download``). When the session that opened a file ends, the file is
released: its parts still being fetched ahead are cancelled or waited for,
so no request of a command is made after the command has returned.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError
from .fetchers import FetchError

EXTRA = "pip install 'ckpt-tool[remote]'"


class RemoteError(InputError):
    """A URL could not be read: not found, access denied, changed, timed out, Range ignored."""

    def __init__(self, message: str, path: str | None = None, kind: str = "error") -> None:
        super().__init__(message, redact(path) if path else path)
        self.kind = kind


def redact(url: str) -> str:
    """A URL fit to print: no user:password, no query string (presigned URLs carry signatures there)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, tail = rest.partition("/")
    host = host.rsplit("@", 1)[-1]
    tail = tail.split("?", 1)[0].split("#", 1)[0]
    return f"{scheme}://{host}{slash}{tail}" + ("?..." if "?" in rest else "")


class MissingExtra(RemoteError):
    """Reading URLs needs the optional ``remote`` extra (fsspec, s3fs, huggingface_hub)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message, path, "missing-extra")


@dataclass(eq=False)
class Session:
    """Files opened for one command (or API call), with what reading them cost."""

    download: bool = False
    parent: Session | None = None
    requests: int = 0
    bytes: int = 0
    files: dict[str, Any] = field(default_factory=dict)  # url -> RemoteFile or the RemoteError it raised
    filesystems: dict[str, Any] = field(default_factory=dict)
    listings: dict[str, list[str]] = field(default_factory=dict)  # folder -> names
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # folder -> name -> bytes, where listed
    folders: dict[str, bool] = field(default_factory=dict)  # url -> is a folder
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def owner(self) -> Session:
        """The outermost session below the process-wide one: nested commands (gate's scan) share its
        files, listings and filesystems, so nothing is fetched twice."""
        s = self
        while s.parent is not None and s.parent.parent is not None:
            s = s.parent
        return s

    @property
    def used(self) -> bool:
        return bool(self.files) or self.requests > 0

    def count(self, requests: int, nbytes: int) -> None:
        s: Session | None = self
        while s is not None:
            with s._lock:
                s.requests += requests
                s.bytes += nbytes
            s = s.parent

    def stats(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes}


_ROOT = Session()
_CURRENT: contextvars.ContextVar[Session] = contextvars.ContextVar("ckpt_remote_session", default=_ROOT)
_MAX_ROOT_FILES = 256  # the process-wide session forgets the oldest files past this (long-running callers)


def current() -> Session:
    return _CURRENT.get()


@contextlib.contextmanager
def remote_session(*, download: bool | None = None) -> Iterator[Session]:
    """A scope whose remote reads are counted together; ``download`` lets whole-file downloads happen."""
    outer = _CURRENT.get()
    s = Session(download=outer.download if download is None else download, parent=outer)
    token = _CURRENT.set(s)
    try:
        yield s
    finally:
        _CURRENT.reset(token)
        release(s.files.values())  # only the owner holds files


def release(files: Any) -> None:
    """End the reads of these files (remotefile.RemoteFile; errors kept in their place are skipped)."""
    for f in list(files):
        if not isinstance(f, BaseException):
            f.release()


def _after_fork() -> None:
    """A forked worker (migrate --workers) starts with its sessions' locks free: another thread of the
    parent may have held one at the fork."""
    s: Session | None = _CURRENT.get()
    while s is not None:
        s._lock = threading.Lock()
        s = s.parent


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def error_for(exc: FetchError, url: str) -> RemoteError:
    """The user's one-line message for a failed request."""
    kind = exc.kind
    if kind == "range-ignored":
        size = f"{exc.size}-byte " if exc.size is not None else ""
        text = (f"the server ignores byte-range requests, so reading this {size}file means downloading "
                "all of it; rerun with --download to allow that")
    elif kind == "changed":
        text = f"the file changed while it was being read ({exc.detail}); run the command again"
    elif kind == "timeout":
        text = f"timed out: {exc.detail} (CKPT_REMOTE_TIMEOUT and CKPT_REMOTE_RETRIES set the limits)"
    elif kind == "denied":
        text = (f"{exc.detail}: check the credentials (HF_TOKEN or `hf auth login` for hf://, "
                "AWS_* variables or ~/.aws for s3://)")
    elif kind == "folder":
        text = f"is {exc.detail}, not a file"
    elif kind == "missing":
        text = f"no such file ({exc.detail})" if exc.detail and exc.detail != "not found" else "no such file"
    else:
        text = exc.detail or kind
    return RemoteError(text, url, kind)
