"""Servers the remote tests start on 127.0.0.1: plain HTTP (with or without Range), a Hub-like endpoint, S3.

Each server logs every request it answers (method, path, Range header,
status, body bytes sent), so tests assert what went over the wire from the
server's own log, never from ckpt's report. Every server stops itself after
``lifetime`` seconds even if a test forgets to stop it.
"""
from __future__ import annotations

import hashlib
import html
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    status: int
    nbytes: int
    headers: dict[str, str] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0


class RangeServer:
    """A folder served over HTTP: byte ranges (or not), ETags and If-Match, listings, an optional Hub API.

    ``hub=True`` also answers the paths huggingface_hub uses: ``/{repo}/resolve/{rev}/{path}``,
    ``/api/models/{repo}[/revision/{rev}]`` and ``/api/models/{repo}/tree/{rev}/{path}``,
    with ``root/{org}/{name}/`` as each repository.
    """

    def __init__(self, root: str | os.PathLike[str], *, ranges: bool = True, hub: bool = False,
                 delay: float = 0.0, lifetime: float = 600.0, listings: bool = True) -> None:
        self.root = Path(root).resolve()
        self.ranges = ranges
        self.listings = listings  # False: folders answer 404 (no index pages)
        self.hub = hub
        self.delay = delay  # seconds before each answer (timeouts)
        self.lifetime = lifetime
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self.active = 0  # requests being answered
        self.changes: dict[str, tuple[int, bytes]] = {}  # path -> (after N requests, the bytes served then)
        self.served: dict[str, int] = {}  # path -> requests answered
        self.deny: set[str] = set()  # paths answered 403
        self.ignore_if_match = False  # a server that does not check If-Match

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> RangeServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def clear(self) -> None:
        """Forget what was answered; a request still being answered is waited for first (its entry is
        written after its body is sent, so it would otherwise land in the next test's log)."""
        self._settle()
        with self._lock:
            self.log.clear()
            self.served.clear()

    def _settle(self) -> None:
        deadline = time.monotonic() + 5
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)

    def requests(self, *, method: str | None = None) -> list[Logged]:
        """The log once no request is being answered (a response is logged after its body is sent)."""
        self._settle()
        with self._lock:
            return [r for r in self.log if method is None or r.method == method]

    def sent(self) -> int:
        return sum(r.nbytes for r in self.requests())

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a refused download, a closed keep-alive connection) is no error to print:
    socketserver would print its traceback on stderr, inside whichever command's output is being captured."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: RangeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are logged in RangeServer.log instead

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    # -- answering ---------------------------------------------------------------
    def _answer(self, *, head: bool) -> None:
        self._t0 = time.monotonic()
        with self.owner._lock:
            self.owner.active += 1
        try:
            self._answer_one(head=head)
        finally:
            with self.owner._lock:
                self.owner.active -= 1

    def _answer_one(self, *, head: bool) -> None:
        owner = self.owner
        if owner.delay:
            time.sleep(owner.delay)
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if owner.hub:
            api = self._hub_api(path)
            if api is not None:
                self._send(200, json.dumps(api).encode(), "application/json", head=head)
                return
            found = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if found is None:
                self._send(404, b"not found", headers={"X-Error-Code": "EntryNotFound"}, head=head)
                return
            path = f"/{found.group(1)}/{found.group(3)}"
        target = (owner.root / path.lstrip("/")).resolve()
        if owner.root not in target.parents and target != owner.root:
            self._send(403, b"forbidden", head=head)
            return
        with owner._lock:
            owner.served[path] = seen = owner.served.get(path, 0) + 1
        if path in owner.deny:
            self._send(403, b"access denied", head=head)
            return
        change = owner.changes.get(path)
        if change is not None and seen > change[0]:
            self._file_bytes(change[1], '"changed"', head=head)
            return
        if target.is_dir() and not owner.hub and not owner.listings:
            self._send(404, b"not found", head=head)
            return
        if target.is_dir() and not owner.hub:
            if not path.endswith("/"):
                self._send(301, b"", headers={"Location": path + "/"}, head=head)
                return
            self._listing(target, path, head=head)
            return
        if not target.is_file():
            self._send(404, b"not found", headers={"X-Error-Code": "EntryNotFound"}, head=head)
            return
        st = target.stat()
        self._file_bytes(target, f'"{st.st_size:x}-{st.st_mtime_ns:x}"', head=head)

    def _file_bytes(self, data: bytes | Path, etag: str, *, head: bool) -> None:
        """A file (read by range, never whole: the benchmarks serve 4 GiB files) or bytes in memory."""
        size = len(data) if isinstance(data, bytes) else data.stat().st_size
        match = self.headers.get("If-Match")
        if match is not None and match != etag and not self.owner.ignore_if_match:
            self._send(412, b"precondition failed", head=head)
            return
        headers = {"ETag": etag, "Accept-Ranges": "bytes" if self.owner.ranges else "none"}
        wanted = self.headers.get("Range")
        if wanted and self.owner.ranges:
            found = _RANGE.match(wanted.strip())
            if found is None or (not found.group(1) and not found.group(2)):
                self._send(416, b"", headers={"Content-Range": f"bytes */{size}"}, head=head)
                return
            if found.group(1):
                start = int(found.group(1))
                end = min(int(found.group(2)) if found.group(2) else size - 1, size - 1)
            else:  # a suffix: the last N bytes
                start, end = max(0, size - int(found.group(2))), size - 1
            if start >= size or start > end:
                self._send(416, b"", headers={"Content-Range": f"bytes */{size}"}, head=head)
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            self._send(206, _Body(data, start, end + 1), "application/octet-stream", headers, head=head)
            return
        self._send(200, _Body(data, 0, size), "application/octet-stream", headers, head=head)

    def _listing(self, folder: Path, path: str, *, head: bool) -> None:
        links = "".join(f'<li><a href="{html.escape(urllib.parse.quote(p.name + ("/" if p.is_dir() else "")))}">'
                        f"{html.escape(p.name)}</a></li>" for p in sorted(folder.iterdir()))
        body = f"<html><body><ul>{links}</ul></body></html>".encode()
        self._send(200, body, "text/html", head=head)

    def _send(self, status: int, body: bytes | _Body, ctype: str = "text/plain",
              headers: dict[str, str] | None = None, *, head: bool) -> None:
        sent = 0
        started = getattr(self, "_t0", time.monotonic())
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                for piece in (body.pieces() if isinstance(body, _Body) else [body]):
                    self.wfile.write(piece)
                    sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up (a refused full download)
            pass
        finally:
            self.owner.record(Logged(self.command, self.path, self.headers.get("Range"), status, sent,
                                     {k.lower(): v for k, v in self.headers.items()}, started, time.monotonic()))

    # -- the Hub's API -----------------------------------------------------------
    def _hub_api(self, path: str) -> Any:
        found = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if found:
            repo = self.owner.root / found.group(1)
            if not repo.is_dir():
                return None
            sha = hashlib.sha1(found.group(1).encode()).hexdigest()
            return {"id": found.group(1), "_id": sha[:24], "sha": sha, "private": False, "siblings": [
                {"rfilename": str(p.relative_to(repo))} for p in sorted(repo.rglob("*")) if p.is_file()]}
        found = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)/?(.*)$", path)
        if found:
            repo = self.owner.root / found.group(1)
            folder = repo / found.group(3)
            if not folder.is_dir():
                return None
            out = []
            for p in sorted(folder.iterdir()):
                rel = str(p.relative_to(repo))
                oid = hashlib.sha1(rel.encode()).hexdigest()
                if p.is_dir():
                    out.append({"type": "directory", "oid": oid, "path": rel})
                else:
                    out.append({"type": "file", "oid": oid, "size": p.stat().st_size, "path": rel})
            return out
        return None


class _Body:
    """Bytes [start, end) of a file or a bytes object, sent in 1 MiB pieces (a hung-up client stops it)."""

    def __init__(self, data: bytes | Path, start: int, end: int) -> None:
        self.data, self.start, self.end = data, start, end

    def __len__(self) -> int:
        return self.end - self.start

    def pieces(self) -> Any:
        step = 1 << 20
        if isinstance(self.data, bytes):
            for at in range(self.start, self.end, step):
                yield self.data[at:min(at + step, self.end)]
            return
        fd = os.open(self.data, os.O_RDONLY)
        try:
            for at in range(self.start, self.end, step):
                yield os.pread(fd, min(step, self.end - at), at)
        finally:
            os.close(fd)


class S3Server:
    """moto's S3 in server mode on 127.0.0.1, its werkzeug request log captured."""

    def __init__(self, lifetime: float = 600.0) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.lines: list[str] = []
        self._handler = _ListHandler(self.lines)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._stopped = False

    def start(self) -> S3Server:
        logger = logging.getLogger("werkzeug")
        logger.addHandler(self._handler)
        logger.setLevel(logging.INFO)
        self._server.start()
        self._timer.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._server.get_host_and_port()
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._timer.cancel()
        self._server.stop()
        logging.getLogger("werkzeug").removeHandler(self._handler)

    def requests(self, path_part: str = "") -> list[str]:
        """Request lines ('GET /bucket/key HTTP/1.1' status) that name ``path_part``."""
        return [line for line in list(self.lines) if path_part in line]

    def clear(self) -> None:
        self.lines.clear()


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if '"' in text and "HTTP/" in text:
            self.lines.append(text)


def comparable_doc(out: str) -> dict:
    """An inspect document without what names the file: its path, the counts, the commands that name it."""
    doc = json.loads(out)
    doc.pop("path", None)
    doc.pop("remote", None)
    wo = doc.get("weights_only")
    if isinstance(wo, dict):  # the commands they suggest name the file (and, for a URL, a local output)
        wo.pop("fix", None)
        wo.pop("sanitize", None)
        wo.pop("extract", None)
    return doc
