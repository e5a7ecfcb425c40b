"""Paths and URLs alike: open, test, list and join, whichever a user gave.

Readers call these instead of os.path and open(): a local path goes to the
standard library, a URL to io/remote/protocols.py (imported only for URLs).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from .bytesource import ByteSource, LocalFile, is_url

__all__ = [
    "basename",
    "count_remote",
    "dirname",
    "is_url",
    "isdir",
    "isfile",
    "join",
    "listdir",
    "missing_files",
    "open_bytes",
    "open_together",
    "remote_session",
    "url_bytes",
]


def open_bytes(path: str) -> ByteSource:
    """The bytes of ``path``: a local file, or a URL read by byte ranges (the ``remote`` extra)."""
    if is_url(path):
        from .remote import open_remote

        return open_remote(path)
    return LocalFile(path)


def open_together(urls: Sequence[str], workers: int = 8) -> None:
    """Open many URLs at once (each file's first request concurrently: the rank files of a DeepSpeed
    run). Each is kept by the session for the reader that comes next; an error is raised by that read."""
    if len(urls) < 2:
        return
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    from .remote import open_remote

    def one(url: str) -> None:
        with contextlib.suppress(InputError):  # kept by the session: the reader of this file raises it
            open_remote(url)

    with ThreadPoolExecutor(min(workers, len(urls)), thread_name_prefix="ckpt-open") as pool:
        for future in [pool.submit(contextvars.copy_context().run, one, u) for u in urls if is_url(u)]:
            future.result()


# -- paths and URLs alike ---------------------------------------------------------


def isdir(path: str) -> bool:
    """A folder (for a URL: a prefix or repository folder that lists files)."""
    if is_url(path):
        from .remote import current, is_folder

        return is_folder(path, current())
    return os.path.isdir(path)


def isfile(path: str) -> bool:
    """A file (for a URL: one that answers its first range request)."""
    if is_url(path):
        from .remote import is_file

        return is_file(path)
    return os.path.isfile(path)


def listdir(path: str) -> list[str]:
    """The names in a folder, sorted."""
    if is_url(path):
        from .remote import current, list_folder

        return list_folder(path, current())
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        raise InputError(f"cannot list folder: {exc.strerror}", path) from None


def join(folder: str, name: str) -> str:
    if is_url(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def dirname(path: str) -> str:
    """The folder holding ``path`` (absolute for a local path)."""
    if is_url(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(path))


def basename(path: str) -> str:
    if is_url(path):
        return path.rstrip("/").rsplit("/", 1)[-1]
    return os.path.basename(path)


def missing_files(folder: str, names: Sequence[str]) -> list[str]:
    """The ``names`` (relative paths) that are not files in ``folder``.

    For a URL, from one listing where the protocol has listings; a plain
    HTTP server has none, and a missing file is then found when it is read.
    """
    if is_url(folder):
        from .remote import missing_in

        return missing_in(folder, names)
    return [n for n in names if not os.path.isfile(os.path.join(folder, n))]


def remote_session(*candidates: object) -> contextlib.AbstractContextManager[Any]:
    """A remote.Session counting the reads of these paths when one is a URL, else a no-op (None).

    Local-only commands never import the remote machinery.
    """
    if not any(isinstance(p, str) and is_url(p) for p in candidates):
        return contextlib.nullcontext(None)
    from .remote import remote_session as session

    return session()


def count_remote(requests: int, nbytes: int) -> None:
    """Add requests made elsewhere (a --workers process reading a URL source) to the current session's counts."""
    from .remote import current

    current().count(requests, nbytes)


def url_bytes(url: str) -> int:
    """A URL's size: a file's from its first response, a folder's from its listing (no extra request
    where the listing was read already; a plain HTTP folder counts the files read from it)."""
    if isdir(url):
        from .remote import current, folder_bytes

        return folder_bytes(url, current())
    return open_bytes(url).size


def outside_folder(folder: str, name: str) -> str | None:
    """Why a file that an index or a DCP ``.metadata`` names lies outside its folder (None: it does not).

    Shared by the index and DCP readers, so that neither imports the other.

    An absolute name, a ``..`` part, or (on a local disk) a symbolic link
    whose target lies outside the folder: a loader that follows it reads a
    file nobody reviewing the folder sees.
    """
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        return "points outside the folder (an absolute path or a '..' part)"
    if is_url(folder):
        return None
    full = os.path.join(folder, *parts)
    if not os.path.lexists(full):
        return None  # missing: the reader says so
    root = os.path.realpath(folder)
    target = os.path.realpath(full)
    if os.path.commonpath([root, target]) != root:
        return f"leads outside the folder through a symbolic link (to {target})"
    return None
