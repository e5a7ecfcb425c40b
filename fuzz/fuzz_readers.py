"""Long fuzz run of every reader (and inspect/diff/migrate/scan on top of them).

    python fuzz/fuzz_readers.py                    # 30 minutes, 2 workers, findings in fuzz/findings/
    python fuzz/fuzz_readers.py --minutes 5 --workers 1 --seed 7

Each worker mutates real checkpoints of every format (the committed fixtures,
plus the malicious corpus of tests/helpers/malicious.py) with fuzz/engine.py and runs
ckpt on them in-process, under an address-space limit so that an allocation
driven by a number in the file shows up as a MemoryError. The parent watches
each worker's heartbeat: an input that keeps a worker busy for --hang-seconds
is saved as a hang. Invariants checked on every run: exit code 0/1/2, at most
one line on stderr, no traceback, no internal error, no MemoryError, valid
--json output, no temporary files left by migrate, and no payload marker
(code execution). Each finding is saved with the input bytes and the
command; the summary (inputs tried, findings) is printed as JSON at the end
and written to fuzz/findings/summary.json. The exit code is 1 when anything
was found.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import engine


def worker(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    resource.setrlimit(resource.RLIMIT_AS, (args.max_memory_gib << 30, args.max_memory_gib << 30))
    base = Path(tempfile.mkdtemp(prefix=f"ckpt-fuzz-{args.seed}-"))
    findings = Path(args.out)
    findings.mkdir(parents=True, exist_ok=True)
    seeds: list[tuple[str, Path, Path, bytes, Path, Path]] = []  # name, target, file, bytes, reference, work
    for name, _rel, _inner in engine.SEEDS:
        work = base / name
        work.mkdir()
        (work / "ref").mkdir()
        ref, _, _ = engine.prepare(name, ROOT / "fixtures", work / "ref")
        target, file, data = engine.prepare(name, ROOT / "fixtures", work)
        seeds.append((name, target, file, data, ref, work))
    markers = None
    if not args.no_malicious:
        from malicious import build_corpus

        corpus = base / "corpus"
        for case in build_corpus(str(corpus)):
            p = Path(case.path)
            if p.is_file():
                work = base / f"mal-{case.name}"
                work.mkdir()
                target = work / p.name
                shutil.copyfile(p, target)
                seeds.append((f"malicious:{case.name}", target, target, p.read_bytes(), p, work))
        markers = corpus / "markers"
    fields = {name: engine.fields_of(data) for name, _, _, data, _, _ in seeds}
    current = base / "current.bin"
    deadline = time.monotonic() + args.minutes * 60
    count = 0
    while time.monotonic() < deadline:
        name, target, file, data, ref, work = rng.choice(seeds)

        def remember(mutated: bytes, desc: str, name: str = name) -> None:
            current.write_bytes(mutated)
            (base / "current.txt").write_text(f"{name}\n{desc}\n")

        print(f"I {count} {name}", flush=True)
        for cmd, desc, outcome, found in engine.fuzz_one(target, target, file, data, ref, work, rng,
                                                         fields[name], remember):
            if markers is not None and markers.exists() and any(markers.iterdir()):
                found.append(f"CODE EXECUTION: markers {sorted(os.listdir(markers))}")
            if found:
                tag = f"{args.seed}-{count}"
                shutil.copyfile(current, findings / f"{tag}.bin")
                (findings / f"{tag}.json").write_text(json.dumps({
                    "seed": name, "mutation": desc, "command": cmd, "code": outcome.code, "stderr": outcome.err,
                    "problems": found,
                }, indent=2))
                print("F " + json.dumps({"tag": tag, "seed": name, "problems": found, "command": cmd[0],
                                         "stderr": outcome.err.strip()[:300]}), flush=True)
        count += 1
        for leftover in work.iterdir():
            if leftover.name.startswith("out") or ".ckpt-tmp-" in leftover.name:
                engine.remove(leftover)
    print(f"D {count}", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    return 0


def parent(args: argparse.Namespace) -> int:
    findings = Path(args.out)
    findings.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    seed = args.seed
    total = 0
    found: list[dict] = []
    hangs = 0
    procs: dict[int, tuple[subprocess.Popen, int, float, int]] = {}  # fd -> (proc, seed, last beat, inputs)

    def spawn(s: int) -> None:
        remaining = max(0.05, (deadline - time.monotonic()) / 60)
        p = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--seed", str(s), "--minutes", f"{remaining:.3f}", "--out",
             str(findings), "--max-memory-gib", str(args.max_memory_gib)]
            + (["--no-malicious"] if args.no_malicious else []),
            stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        assert p.stdout is not None
        procs[p.stdout.fileno()] = (p, s, time.monotonic(), 0)

    for i in range(args.workers):
        spawn(seed + i)
    seed += args.workers
    while procs:
        ready, _, _ = select.select(list(procs), [], [], 5)
        now = time.monotonic()
        for fd in ready:
            p, s, _, n = procs[fd]
            line = p.stdout.readline() if p.stdout else ""
            if not line:
                p.wait()
                total += n
                del procs[fd]
                if p.returncode not in (0, None) and now < deadline - 10:
                    found.append({"tag": f"{s}-crash", "problems": [f"worker died with {p.returncode}"]})
                    spawn(seed)
                    seed += 1
                continue
            if line.startswith("I "):
                procs[fd] = (p, s, now, int(line.split()[1]) + 1)
            elif line.startswith("F "):
                found.append(json.loads(line[2:]))
                print(line.strip(), flush=True)
                procs[fd] = (p, s, now, n)
            elif line.startswith("D "):
                procs[fd] = (p, s, now, int(line.split()[1]))
        for fd, (p, s, beat, n) in list(procs.items()):
            if now - beat > args.hang_seconds:
                hangs += 1
                tag = f"{s}-hang-{n}"
                tmp = Path(tempfile.gettempdir())
                for cur in tmp.glob(f"ckpt-fuzz-{s}-*/current.*"):
                    shutil.copyfile(cur, findings / f"{tag}{cur.suffix}")
                found.append({"tag": tag, "problems": [f"no progress for {args.hang_seconds} s (hang)"]})
                print(f"F hang {tag}", flush=True)
                p.kill()
                p.wait()
                total += n
                del procs[fd]
                if now < deadline - 10:
                    spawn(seed)
                    seed += 1
    summary = {"minutes": round((time.monotonic() - start) / 60, 2), "workers": args.workers,
               "first_seed": args.seed, "inputs": total, "findings": len(found), "hangs": hangs,
               "details": found[:50]}
    (findings / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "details"}))
    return 1 if found else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "findings"))
    ap.add_argument("--hang-seconds", type=int, default=60)
    ap.add_argument("--max-memory-gib", type=int, default=4)
    ap.add_argument("--no-malicious", action="store_true", help="Only the benign fixtures (no torch/dill needed).")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return worker(args) if args.worker else parent(args)


if __name__ == "__main__":
    sys.exit(main())
