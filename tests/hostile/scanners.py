"""Other scanners on the hostile corpus: picklescan, modelscan, fickling and hayward, each as its CLI decides.

They are baselines for docs/security.md, never dependencies of ckpt. Install
them in a virtual environment OUTSIDE the repository (fickling needs torch for
its PyTorch-zip analysis, and typing_extensions, neither of which it pulls in):

    python3 -m venv /work/wt/scanners
    /work/wt/scanners/bin/pip install picklescan==1.0.5 modelscan==0.8.8 fickling==0.1.12 hayward==1.4.1 \\
        typing_extensions torch

How each one is driven (one subprocess per case, ``TIMEOUT_S`` each: a FIFO
blocks some of them; fickling, which imports torch, in one process for all
cases with an alarm of ``TIMEOUT_S`` per case), and how its answer becomes an
outcome:

- **picklescan** ``picklescan -p PATH`` (a folder is scanned recursively). Its
  CLI exits 1 when a dangerous global was found, 2 on a scan error, else 0;
  ``dangerous`` when it names a dangerous global (``Dangerous globals: N`` with
  N > 0, also under exit 2), ``error`` for exit 2 otherwise, ``warns`` for
  suspicious globals only (exit 0), else ``clean``.
- **modelscan** ``modelscan -p PATH -r json -o REPORT``: exit 1 issues found
  (``dangerous``), 2 scan error (``error``), 3 no supported file (``skipped``),
  0 ``clean``.
- **fickling** has no local-model mode in its CLI (``fickling --check-safety
  FILE`` parses FILE as one pickle stack and errors on every zip), so it is
  driven the way its own ``--huggingface`` mode decides per file
  (``fickling.cli._scan_huggingface``): ``find_file_properties`` picks
  ``scan_zip_archive(graceful=True)`` for torch zips, standard zips and
  ``.pt``/``.pth``, ``scan_file(graceful=True)`` for valid pickles and
  ``.bin``/``.pkl``/``.pickle``, and skips tar, NumPy and other files; the
  verdict is unsafe when a result is not ``is_safe`` (``dangerous``), else
  ``error`` when a result has errors (that mode still exits 0), ``skipped``
  when nothing was scanned, else ``clean``. A folder: every file in it.
- **hayward** ``hayward scan PATH -f json --quiet``: default ``--fail-on high``,
  exit 1 (``dangerous``) when a finding is high or critical, 2 on a usage or
  read error (``error``); exit 0 with lower findings is ``warns``, with
  ``coverage_gaps`` and no finding ``error`` (a file it could not read fully),
  else ``clean``.

A timeout is ``hangs``; each scanner process is limited to ``MEMORY_LIMIT`` of
address space (picklescan reads ``/dev/zero`` until memory runs out), and running
out of it is that scanner's ``error``. ``python -m tests.hostile.scanners VENV OUT.json``
builds the corpus in a temporary folder and writes every outcome.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

VERSIONS = {"picklescan": "1.0.5", "modelscan": "0.8.8", "fickling": "0.1.12", "hayward": "1.4.1"}
TIMEOUT_S = 30
# picklescan reads /dev/zero until memory runs out (11 GiB in 20 s here): every scanner gets this much address space.
MEMORY_LIMIT = 6 << 30

# Run by the scanners' interpreter: fickling's per-file decision of its --huggingface mode, on local paths.
_FICKLING = r"""
import json, os, signal, sys
from pathlib import PurePosixPath
import fickling
from fickling.cli import HF_RAW_PICKLE_EXTENSIONS, HF_ZIP_PICKLE_EXTENSIONS
from fickling.polyglot import find_file_properties
TIMEOUT = int(sys.argv[1])

def one(path):
    ext = PurePosixPath(path).suffix.lower()
    props = find_file_properties(path)
    if props["is_torch_zip"] or props["is_standard_zip"] or ext in HF_ZIP_PICKLE_EXTENSIONS:
        return list(fickling.scan_zip_archive(path, graceful=True).values())
    if props["is_valid_pickle"] or ext in HF_RAW_PICKLE_EXTENSIONS:
        return [fickling.scan_file(path, graceful=True)]
    return None

def verdict(path):
    walk = sorted(os.walk(path)) if os.path.isdir(path) else []
    files = [os.path.join(r, f) for r, _, fs in walk for f in sorted(fs)] if walk else [path]
    results, scanned, errors = [], 0, []
    for f in files:
        try:
            got = one(f)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200]); continue
        if got is None:
            continue
        scanned += 1
        results += got
    unsafe = [r for r in results if not r.is_safe]
    errors += [str(e)[:200] for r in results for e in (r.errors or [])]
    outcome = "dangerous" if unsafe else "error" if errors else "clean" if scanned else "skipped"
    return {"outcome": outcome, "detail": "; ".join(errors)[:300]}

def on_alarm(signum, frame):
    raise TimeoutError("no answer in time")

signal.signal(signal.SIGALRM, on_alarm)
for path in json.loads(sys.stdin.read()):  # one process for every case: importing torch costs seconds
    signal.alarm(TIMEOUT)
    try:
        res = verdict(path)
    except TimeoutError:
        res = {"outcome": "hangs"}
    except BaseException as exc:
        res = {"outcome": "error", "detail": f"{type(exc).__name__}: {exc}"[:300]}
    signal.alarm(0)
    print(json.dumps({"path": path, **res}), flush=True)
"""


def _limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(cmd: list[str], cwd: str) -> tuple[int | str, str]:
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                           stdin=subprocess.DEVNULL, preexec_fn=_limit)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", ""


def picklescan(venv: str, path: str, work: str) -> dict[str, Any]:
    code, out = _run([os.path.join(venv, "bin", "picklescan"), "-p", path], work)
    if code == "timeout":
        return {"outcome": "hangs"}
    m = re.search(r"Dangerous globals: (\d+)", out)
    s = re.search(r"Suspicious globals: (\d+)", out)
    if code == 1 or (m and int(m.group(1))):
        outcome = "dangerous"
    elif code != 0:
        outcome = "error"
    else:
        outcome = "warns" if s and int(s.group(1)) else "clean"
    return {"outcome": outcome, "code": code, "detail": out.strip()[-300:]}


def modelscan(venv: str, path: str, work: str) -> dict[str, Any]:
    report = os.path.join(work, "modelscan.json")
    code, out = _run([os.path.join(venv, "bin", "modelscan"), "-p", path, "-r", "json", "-o", report], work)
    if code == "timeout":
        return {"outcome": "hangs"}
    outcome = {0: "clean", 1: "dangerous", 2: "error", 3: "skipped"}.get(code, "error")  # type: ignore[call-overload]
    return {"outcome": outcome, "code": code, "detail": out.strip()[-300:]}


def fickling(venv: str, paths: list[str], work: str) -> dict[str, dict[str, Any]]:
    """All paths in one process (per path an alarm of TIMEOUT_S); a path it never answered is an error."""
    try:
        p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", _FICKLING, str(TIMEOUT_S)],
                           check=False, input=json.dumps(paths), capture_output=True, text=True, cwd=work,
                           timeout=TIMEOUT_S * (len(paths) + 1), preexec_fn=_limit)
        out = p.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    got: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        got[rec.pop("path")] = rec
    return {p: got.get(p, {"outcome": "error", "detail": "no answer (the process died)"}) for p in paths}


def hayward(venv: str, path: str, work: str) -> dict[str, Any]:
    code, out = _run([os.path.join(venv, "bin", "hayward"), "scan", path, "-f", "json", "--quiet"], work)
    if code == "timeout":
        return {"outcome": "hangs"}
    try:
        doc = json.loads(out[out.index("{"):])
    except ValueError:
        doc = {}
    if code == 1:
        outcome = "dangerous"
    elif code != 0:
        outcome = "error"
    elif doc.get("findings"):
        outcome = "warns"
    else:
        outcome = "error" if doc.get("coverage_gaps") else "clean"
    return {"outcome": outcome, "code": code, "detail": json.dumps(doc.get("coverage_gaps") or "")[:300]}


DRIVERS = {"picklescan": picklescan, "modelscan": modelscan, "fickling": fickling, "hayward": hayward}
BATCHED = ("fickling",)


def run_all(venv: str, names: list[str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every scanner on a fresh build of the corpus: {scanner: {case: result}}."""
    from tests.hostile.generate import build

    folder = tempfile.mkdtemp(prefix="ckpt-hostile-scanners-")
    work = tempfile.mkdtemp(prefix="ckpt-hostile-scanners-work-")
    try:
        cases = build(os.path.join(folder, "corpus"))
        cases = [c for c in cases if names is None or c.name in names]
        out: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in DRIVERS}
        for case in cases:
            for scanner, drive in DRIVERS.items():
                if scanner not in BATCHED:
                    out[scanner][case.name] = drive(venv, case.path, work)
        by_path = fickling(venv, [c.path for c in cases], work)
        out["fickling"] = {c.name: by_path[c.path] for c in cases}
        leftover = os.listdir(os.path.join(folder, "corpus", "markers"))
        if leftover:  # a scanner that runs payloads would make its column meaningless
            raise RuntimeError(f"a scanner ran payloads: {sorted(leftover)}")
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    with open(sys.argv[2], "w") as f:
        json.dump(run_all(sys.argv[1]), f, indent=1)
