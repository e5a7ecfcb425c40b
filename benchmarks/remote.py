"""ckpt on URLs against downloading first: inspect, diff and gate of the 1 GiB and 4 GiB checkpoints.

A local HTTP server (tests/helpers/remote_servers.py, byte ranges, logging every
request) serves benchmarks/data/ on 127.0.0.1. For each input and command:

* ``url``: ``ckpt CMD URL`` reading byte ranges;
* ``download``: the file fetched whole with the same HTTP client ckpt uses
  (huggingface_hub's, streamed to a local file), then ``ckpt CMD FILE``.

Bytes and requests come from the server's log; wall time is the whole
process (or both steps), the median of ``--runs``. Loopback has no latency
and ~GB/s bandwidth, so the wall times here are the best case for
downloading: over a real network the gap in time grows with the bytes.

    python3 benchmarks/remote.py [--quick] [--runs N] [--data DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))

import generate  # noqa: E402
from remote_servers import RangeServer  # noqa: E402

CASES = [  # (label, ckpt arguments; {A} and {B} are replaced by the inputs)
    ("inspect", ["inspect", "--json", "{A}"]),
    ("diff", ["diff", "--json", "{A}", "{B}"]),
    ("gate", ["gate", "--json", "{A}"]),  # loads safely + NaN/Inf check: reads every tensor
]


def _ckpt(args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ckpt_tool", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"ckpt {' '.join(args)} failed: {proc.stderr.strip()}")
    return wall


def _download(url: str, dest: str) -> float:
    from huggingface_hub.utils import http_stream_backoff

    t0 = time.perf_counter()
    with http_stream_backoff("GET", url) as r, open(dest, "wb") as out:
        for chunk in r.iter_bytes(1 << 22):
            out.write(chunk)
    return time.perf_counter() - t0


def measure(server: RangeServer, data: str, name: str, ext: str, runs: int) -> list[str]:
    a, b = f"{name}{ext}", f"{name}-near.safetensors" if ext == ".safetensors" else f"{name}.safetensors"
    rows = []
    for label, template in CASES:
        inputs = [a] if "{B}" not in template else [a, b]
        url_walls, dl_walls = [], []
        url_bytes = url_requests = dl_bytes = 0
        for _ in range(runs):
            server.clear()
            url_walls.append(_ckpt([x.format(A=f"{server.url}/{a}", B=f"{server.url}/{b}") for x in template]))
            log = server.requests()
            url_bytes, url_requests = sum(r.nbytes for r in log), len(log)
            with tempfile.TemporaryDirectory(dir=data) as tmp:
                server.clear()
                wall = sum(_download(f"{server.url}/{x}", os.path.join(tmp, x)) for x in inputs)
                dl_bytes = server.sent()
                wall += _ckpt([x.format(A=os.path.join(tmp, a), B=os.path.join(tmp, b)) for x in template])
                dl_walls.append(wall)
        size = sum(os.path.getsize(os.path.join(data, x)) for x in inputs)
        rows.append(f"| {a} | {label} | {_mb(size)} | {url_requests} | {_mb(url_bytes)} | "
                    f"{statistics.median(url_walls):.2f} s | {_mb(dl_bytes)} | {statistics.median(dl_walls):.2f} s |")
        print(rows[-1], flush=True)
    return rows


def _mb(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n / 1024:,.1f} KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the 1 GiB inputs")
    ap.add_argument("--runs", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--data", default=generate.DEFAULT_DATA, help="inputs (benchmarks/generate.py writes them)")
    args = ap.parse_args(argv)
    os.makedirs(args.data, exist_ok=True)
    generate.generate_lm(args.data, "lm-1g", 1 * generate.GIB, sharded=False)
    names = ["lm-1g"]
    if not args.quick:
        generate.generate_lm(args.data, "lm-4g", 4 * generate.GIB, sharded=True)
        names.append("lm-4g")
    header = ["| input | command | size | URL: requests | URL: fetched | URL: wall | download: fetched | "
              "download + local: wall |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    rows = []
    with RangeServer(args.data, lifetime=7200) as server:
        for name in names:
            for ext in (".safetensors", ".pth"):
                rows += measure(server, args.data, name, ext, args.runs)
    out = os.path.join(args.data, "REMOTE.md")
    with open(out, "w") as f:
        f.write("\n".join(header + rows) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
