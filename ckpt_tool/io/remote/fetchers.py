"""One range request per call, per protocol: the only code that talks to a network library.

- ``https://`` and ``hf://`` files: huggingface_hub's HTTP client (the one
  HfFileSystem reads with), which retries timeouts, 429 and 5xx with
  exponential backoff and lets the response headers be checked before its
  body is read: status 206, ``Content-Range`` (the file's size) and ``ETag``.
  fsspec's own HTTP file hides those headers and reads a whole body when a
  server ignores Range.
- ``s3://``: s3fs's client (botocore credentials, s3fs's retries), one
  ``GetObject`` with ``Range`` and ``IfMatch``.
- any other fsspec protocol: ``info`` once, then ``cat_file`` ranges.

Errors become exceptions of remote.py's vocabulary (raised by callers);
credentials are whatever the libraries find and are never logged here.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)")


@dataclass
class Fetched:
    """One response: its bytes, the file's total size and ETag when the response gave them."""

    data: bytes
    size: int | None
    etag: str | None
    requests: int = 1


class FetchError(Exception):
    """A failed request, classified; remote.py turns it into the user's one-line message."""

    def __init__(self, kind: str, detail: str = "", size: int | None = None) -> None:
        super().__init__(detail or kind)
        self.kind = kind  # missing, denied, range-ignored, changed, timeout, folder, error
        self.detail = detail
        self.size = size


def timeout_s() -> float:
    return float(os.environ.get("CKPT_REMOTE_TIMEOUT", "30"))


def retries() -> int:
    return int(os.environ.get("CKPT_REMOTE_RETRIES", "5"))


_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("ckpt_quiet_http", default=False)
_FILTERED: list[logging.Logger] = []


class _InsideFetch(logging.Filter):
    """Drops huggingface_hub's retry warnings for ckpt's own requests (their outcome is the one line
    ckpt prints); the library's other users still see theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _QUIET.get()


@contextlib.contextmanager
def _quiet_retries() -> Iterator[None]:
    if not _FILTERED:
        log = logging.getLogger("huggingface_hub.utils._http")
        log.addFilter(_InsideFetch())
        _FILTERED.append(log)
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def _strong(etag: str | None) -> str | None:
    return etag if etag and not etag.startswith("W/") else None


class HttpFetcher:
    """Range GETs over HTTP(S) with huggingface_hub's retrying client."""

    def __init__(self, url: str, headers: Callable[[], dict[str, str]] | None = None) -> None:
        self.url = url
        self._headers = headers

    def _request_headers(self) -> dict[str, str]:
        return dict(self._headers()) if self._headers is not None else {}

    def fetch(self, start: int, end: int, etag: str | None) -> Fetched:
        import httpx2
        from huggingface_hub.utils import http_stream_backoff

        headers = self._request_headers()
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"
        if _strong(etag):
            headers["If-Match"] = etag  # type: ignore[assignment]
        try:
            with _quiet_retries(), http_stream_backoff("GET", self.url, headers=headers, timeout=timeout_s(),
                                                       max_retries=retries(), base_wait_time=0.5,
                                                       max_wait_time=8) as r:
                return self._response(r, start, end)
        except FetchError:
            raise
        except httpx2.TimeoutException as exc:
            raise FetchError("timeout", f"no answer within {timeout_s():g} s after {retries()} retries "
                                        f"({type(exc).__name__})") from None
        except httpx2.HTTPStatusError as exc:
            raise _status_error(exc.response.status_code, exc.response.headers) from None
        except httpx2.HTTPError as exc:
            raise FetchError("error", f"cannot reach the server: {type(exc).__name__}: {exc}") from None

    def _response(self, r: Any, start: int, end: int) -> Fetched:
        status = r.status_code
        etag = r.headers.get("ETag")
        if status == 206:
            found = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            total = int(found.group(3)) if found and found.group(3) != "*" else None
            if found and found.group(1) is not None and int(found.group(1)) != start:
                raise FetchError("error", f"asked for bytes from {start}, the server sent them from {found.group(1)}")
            return Fetched(r.read(), total, etag)
        if status == 200:
            if str(r.url).endswith("/") and not self.url.endswith("/"):
                raise FetchError("folder", "a folder (the server redirected to its listing)")
            length = r.headers.get("Content-Length")
            size = int(length) if length is not None and length.isdigit() else None
            if start == 0 and size is not None and size <= end:
                return Fetched(r.read(), size, etag)  # the whole file fits in what was asked for
            raise FetchError("range-ignored", "the server ignores byte-range requests", size)
        if status == 416:
            found = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if found and found.group(3) != "*":
                return Fetched(b"", int(found.group(3)), etag)
        raise _status_error(status, r.headers)

    def download(self, out: BinaryIO, on_bytes: Callable[[int], None]) -> int:
        """The whole file into ``out`` (--download, for servers that ignore Range)."""
        import httpx2
        from huggingface_hub.utils import http_stream_backoff

        total = 0
        try:
            with _quiet_retries(), http_stream_backoff("GET", self.url, headers=self._request_headers(),
                                                       timeout=timeout_s(), max_retries=retries(),
                                                       base_wait_time=0.5, max_wait_time=8) as r:
                if r.status_code != 200:
                    raise _status_error(r.status_code, r.headers)
                for chunk in r.iter_bytes(1 << 20):
                    out.write(chunk)
                    total += len(chunk)
                    on_bytes(len(chunk))
        except httpx2.TimeoutException:
            raise FetchError("timeout", f"no answer within {timeout_s():g} s") from None
        except httpx2.HTTPError as exc:
            raise FetchError("error", f"download failed: {type(exc).__name__}: {exc}") from None
        return total


def _status_error(status: int, headers: Any) -> FetchError:
    code = headers.get("X-Error-Code", "") if headers is not None else ""
    hint = f", {code}" if code else ""
    if status in (404, 410):
        return FetchError("missing", f"not found (HTTP {status}{hint})")
    if status in (401, 403):
        return FetchError("denied", f"access denied (HTTP {status}{hint})")
    if status == 412:
        return FetchError("changed", "the server's copy no longer matches the ETag read before (HTTP 412)")
    if status == 416:
        return FetchError("changed", "the file is shorter than it was when first read (HTTP 416)")
    return FetchError("error", f"the server answered HTTP {status}{hint}")


class S3Fetcher:
    """Range GETs of one S3 object through s3fs's client (its credentials chain and retries)."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.url = path
        self.bucket, self.key, self.version = fs.split_path(path)

    def fetch(self, start: int, end: int, etag: str | None) -> Fetched:
        from fsspec.asyn import sync

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key, "Range": f"bytes={start}-{end - 1}"}
        if self.version:
            kwargs["VersionId"] = self.version
        if etag:
            kwargs["IfMatch"] = etag

        async def get() -> Fetched:
            resp = await self.fs._call_s3("get_object", **kwargs)
            try:
                body = await resp["Body"].read()
            finally:
                resp["Body"].close()
            found = _CONTENT_RANGE.match(resp.get("ContentRange") or "")
            size = int(found.group(3)) if found and found.group(3) != "*" else None
            return Fetched(body, size, resp.get("ETag"))

        if not self.key:
            raise FetchError("folder", "a bucket")
        try:
            fetched: Fetched = sync(self.fs.loop, get)  # fsspec's sync is untyped: it returns what get returns
            return fetched
        except Exception as exc:  # noqa: BLE001 - s3fs/botocore raise many types; classified here, once
            raise classify(exc) from None

    def download(self, out: BinaryIO, on_bytes: Callable[[int], None]) -> int:
        return _copy_stream(self.fs, self.url, out, on_bytes)


class FsspecFetcher:
    """Any other fsspec protocol: one ``info`` for the size, then ``cat_file`` ranges."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.url = path
        self._info: dict[str, Any] | None = None

    def fetch(self, start: int, end: int, etag: str | None) -> Fetched:
        extra = 0
        try:
            if self._info is None:
                self._info = self.fs.info(self.url)
                extra = 1
            if self._info.get("type") == "directory":
                raise FetchError("folder", "a folder")
            size = int(self._info.get("size") or 0)
            tag = self._info.get("ETag") or self._info.get("etag")
            data = self.fs.cat_file(self.url, start=start, end=min(end, size)) if start < size else b""
        except FetchError:
            raise
        except Exception as exc:  # noqa: BLE001 - every fsspec implementation raises its own types
            raise classify(exc) from None
        return Fetched(bytes(data), size, str(tag) if tag else None, 1 + extra)

    def download(self, out: BinaryIO, on_bytes: Callable[[int], None]) -> int:
        return _copy_stream(self.fs, self.url, out, on_bytes)


def _copy_stream(fs: Any, path: str, out: BinaryIO, on_bytes: Callable[[int], None]) -> int:
    total = 0
    try:
        with fs.open(path, "rb", block_size=1 << 22) as f:
            while True:
                chunk = f.read(1 << 22)
                if not chunk:
                    return total
                out.write(chunk)
                total += len(chunk)
                on_bytes(len(chunk))
    except Exception as exc:  # noqa: BLE001 - every fsspec implementation raises its own types
        raise classify(exc) from None


def classify(exc: BaseException) -> FetchError:
    """A library's exception as a FetchError (the message never includes credentials)."""
    import errno

    name = type(exc).__name__
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, FileNotFoundError) or "NotFound" in name:
        return FetchError("missing", "not found")
    if isinstance(exc, PermissionError):
        return FetchError("denied", "access denied")
    if isinstance(exc, OSError) and exc.errno == errno.EINVAL and "condition" in str(exc).lower():
        return FetchError("changed", "the object no longer matches the ETag read before (precondition failed)")
    if isinstance(exc, IsADirectoryError):
        return FetchError("folder", "a folder")
    if "NoCredentials" in name or ("credentials" in str(exc).lower() and "not" in str(exc).lower()):
        return FetchError("denied", "no credentials found (AWS_* variables, ~/.aws, or an instance role)")
    if "Timeout" in name or isinstance(exc, TimeoutError):
        return FetchError("timeout", f"timed out ({name})")
    text = str(exc).splitlines()[0] if str(exc) else name
    return FetchError("error", f"{name}: {text}"[:300])
