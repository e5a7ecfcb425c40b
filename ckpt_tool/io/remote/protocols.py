"""Which library reads which URL, and folders behind URLs (listings, existence).

Everything here is imported only for a URL: the core install never imports
fsspec, s3fs or huggingface_hub, and a missing one is a one-line error
naming the ``remote`` extra.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from .fetchers import FetchError, FsspecFetcher, HttpFetcher, S3Fetcher
from .file import RemoteFile
from .session import _MAX_ROOT_FILES, _ROOT, EXTRA, MissingExtra, RemoteError, Session, current, error_for

_HTTP = ("http", "https")
__all__ = ["current", "is_file", "is_folder", "list_folder", "missing_in", "open_remote"]


def open_remote(url: str) -> RemoteFile:
    """The file at ``url``, opened once per session (the first request is shared by every reader)."""
    sess = current()
    found = sess.owner.files.get(url)
    if isinstance(found, RemoteFile):
        return found
    if isinstance(found, RemoteError):
        raise found
    try:
        f = RemoteFile(url, fetcher_for(url, sess), sess)
    except FetchError as exc:
        sess.count(1, 0)
        err = error_for(exc, url)
        sess.owner.files[url] = err
        raise err from None
    held = sess.owner.files
    held[url] = f
    if sess is _ROOT and len(held) > _MAX_ROOT_FILES:
        old = held.pop(next(iter(held)))
        if isinstance(old, RemoteFile):
            old.release()
    return f


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _require(module: str, url: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"reading {scheme_of(url)}:// URLs needs ckpt's optional remote support "
                           f"({module} is not installed): {EXTRA}", url) from None


def filesystem(protocol: str, url: str, sess: Session) -> Any:
    """An fsspec filesystem for ``protocol``, one per session (fresh listings, no stale cache)."""
    sess = sess.owner
    found = sess.filesystems.get(protocol)
    if found is not None:
        return found
    fsspec = _require("fsspec", url)
    kwargs: dict[str, Any] = {"skip_instance_cache": True}
    if protocol == "hf":
        _require("huggingface_hub", url)
        kwargs["endpoint"] = hf_endpoint()
    try:
        fs = fsspec.filesystem(protocol, **kwargs)
    except ImportError as exc:
        raise MissingExtra(f"the {protocol}:// protocol needs a package that is not installed ({exc}); "
                           f"for s3:// and hf://: {EXTRA}", url) from None
    except ValueError:
        raise RemoteError(f"no fsspec filesystem knows the protocol {protocol!r}", url) from None
    sess.filesystems[protocol] = fs
    return fs


def hf_endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def _hf_uri(url: str) -> Any:
    _require("huggingface_hub", url)
    from huggingface_hub.utils import parse_hf_uri

    try:
        return parse_hf_uri(url.rstrip("/"))
    except Exception as exc:  # noqa: BLE001 - HfUriError and ValueError: a malformed hf:// URL
        raise RemoteError(f"not a valid hf:// URL ({exc}); use hf://ORG/REPO/PATH", url) from None


def fetcher_for(url: str, sess: Session) -> Any:
    """The object that makes this URL's range requests."""
    scheme = scheme_of(url)
    if scheme in _HTTP:
        _require("huggingface_hub", url)
        return HttpFetcher(url)
    if scheme == "hf":
        uri = _hf_uri(url)
        if getattr(uri, "type", "model") == "bucket":
            return FsspecFetcher(filesystem("hf", url, sess), url)
        if not uri.path_in_repo:
            raise FetchError("folder", "a repository")
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        file_url = hf_hub_url(uri.id, uri.path_in_repo, repo_type=uri.type, revision=uri.revision,
                              endpoint=hf_endpoint())
        return HttpFetcher(file_url, headers=build_hf_headers)  # the token from HF_TOKEN or `hf auth login`
    if scheme in ("s3", "s3a"):
        return S3Fetcher(filesystem("s3", url, sess), url)
    return FsspecFetcher(filesystem(scheme, url, sess), url)


def _fs_path(url: str) -> str:
    return url if scheme_of(url) in _HTTP else url.split("://", 1)[1]


def is_folder(url: str, sess: Session) -> bool:
    """Whether ``url`` is a folder: a file is opened (its first request is kept for the reader);
    what is not a file is listed (the listing is kept too). A trailing slash means a folder."""
    owner = sess.owner
    if url in owner.folders:
        return owner.folders[url]
    scheme = scheme_of(url)
    if url.endswith("/"):
        answer = True  # no request: a missing folder fails at its first read
    else:
        try:
            open_remote(url)
            answer = False
        except RemoteError as exc:
            kind = getattr(exc, "kind", "")
            if kind == "folder":
                answer = True
            elif kind != "missing" or scheme in _HTTP:
                raise
            else:
                answer = bool(list_folder(url, sess))
    owner.folders[url] = answer
    return answer


def is_file(url: str) -> bool:
    """Whether ``url`` is a file; answered from its folder's listing when that was read already."""
    sess = current()
    folder, _, name = url.rstrip("/").rpartition("/")
    listed = sess.owner.listings.get(folder) if can_list(url) else None  # an HTML index is no proof
    if listed is not None and name not in listed:
        return False
    try:
        open_remote(url)
        return True
    except RemoteError as exc:
        if getattr(exc, "kind", "") in ("missing", "folder"):
            return False
        raise


def missing_in(folder: str, names: Sequence[str]) -> list[str]:
    """The names not in ``folder``'s listing, when it was listed already; otherwise none (no request
    is spent on it: a missing file is found when it is read)."""
    listed = current().owner.listings.get(folder.rstrip("/")) if can_list(folder) else None
    if listed is None:
        return []
    present = set(listed)
    return [n for n in names if n not in present]


def can_list(url: str) -> bool:
    """Plain HTTP has no listings (a server's HTML index page is no promise)."""
    return scheme_of(url) not in _HTTP


def list_folder(url: str, sess: Session) -> list[str]:
    """The names directly in a folder, sorted (one listing request, kept for the session)."""
    key = url.rstrip("/")
    found = sess.owner.listings.get(key)
    if found is not None:
        return found
    scheme = scheme_of(url)
    base = key + "/"
    sizes: dict[str, int] = {}
    try:
        if scheme in _HTTP:
            _require("aiohttp", url)
            fs = filesystem(scheme, url, sess)
            try:
                entries = fs.ls(base, detail=False)
            except FileNotFoundError:  # no index page: a listing is no promise over plain HTTP
                entries = []
            names = [e[len(base):].rstrip("/") for e in entries if e.startswith(base)]
        else:
            fs = filesystem("hf" if scheme == "hf" else scheme, url, sess)
            details = fs.ls(_fs_path(base).rstrip("/"), detail=True)
            names = []
            for d in details:
                name = str(d["name"]).rstrip("/").rsplit("/", 1)[-1]
                names.append(name)
                if d.get("type") == "file" and d.get("size") is not None:
                    sizes[name] = int(d["size"])
    except RemoteError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's own error types
        from .fetchers import classify

        raise error_for(classify(exc), url) from None
    sess.count(1, 0)
    names = sorted({n for n in names if n and "/" not in n})
    sess.owner.listings[key] = names
    sess.owner.sizes[key] = sizes
    return names


def folder_bytes(url: str, sess: Session) -> int:
    """The bytes of the files in a folder, without a request: from its listing when one was read,
    else the files read from it."""
    key = url.rstrip("/")
    sizes = sess.owner.sizes.get(key)
    if sizes:
        return sum(sizes.values())
    base = key + "/"
    return sum(f.size for name, f in sess.owner.files.items()
               if isinstance(f, RemoteFile) and name.startswith(base) and "/" not in name[len(base):])
