"""Side-by-side detection table: ckpt scan vs picklescan vs fickling on the same corpus.

    python benchmarks/compare_scanners.py --install          # pip-installs the other scanners into a temp dir
    python benchmarks/compare_scanners.py --markdown table.md

picklescan and fickling are installed with pip into a separate folder
(``--scanners-dir``), never as ckpt dependencies, and each runs in its own
subprocess over the malicious corpus of tests/helpers/malicious.py and the clean
fixtures. Each cell says what the tool reported:

* ``detected``   the file is reported dangerous / unsafe
* ``suspicious`` flagged, but only at a lower level (picklescan "suspicious", fickling "suspicious")
* ``error``      the tool failed to scan the file (a CI job fails, but nothing is named)
* ``missed``     reported clean
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))

DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "ckpt-compare-scanners")

PICKLESCAN = r"""
import json, os, sys
from picklescan.scanner import scan_directory_path, scan_file_path, SafetyLevel
out = {}
for path in json.loads(sys.argv[1]):
    try:
        r = scan_directory_path(path) if os.path.isdir(path) else scan_file_path(path)
    except Exception as exc:  # a crash of the scanner is its verdict on this file
        out[path] = "error"; continue
    if r.infected_files or any(g.safety == SafetyLevel.Dangerous for g in r.globals):
        out[path] = "detected"
    elif r.scan_err:
        out[path] = "error"
    elif getattr(r, "suspicious_count", 0) or any(g.safety == SafetyLevel.Suspicious for g in r.globals):
        out[path] = "suspicious"
    else:
        out[path] = "missed"
print(json.dumps(out))
"""

FICKLING = r"""
import json, os, sys, zipfile
import fickling
from fickling.analysis import Severity
def one(path):
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        results = list(fickling.scan_zip_archive(path, graceful=True).values())
    else:
        results = [fickling.scan_file(path, graceful=True)]
    if not results:
        return "missed"
    worst = max(r.severity for r in results)
    errors = any(r.errors for r in results)
    if worst >= Severity.LIKELY_UNSAFE and not (errors and all(not r.results for r in results)):
        return "detected"
    if errors:
        return "error"
    if worst > Severity.LIKELY_SAFE:
        return "suspicious"
    return "missed"
order = {"missed": 0, "suspicious": 1, "error": 2, "detected": 3}
out = {}
for path in json.loads(sys.argv[1]):
    files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
    verdicts = []
    for f in files:
        try:
            verdicts.append(one(f))
        except Exception:  # a crash of the scanner is its verdict on this file
            verdicts.append("error")
    out[path] = max(verdicts, key=order.__getitem__) if verdicts else "missed"
print(json.dumps(out))
"""


def install(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", folder, "picklescan", "fickling"],
                   check=True)


def versions(folder: str) -> dict[str, str]:
    code = ("import json, importlib.metadata as m; "
            "print(json.dumps({n: m.version(n) for n in ('picklescan', 'fickling')}))")
    env = dict(os.environ, PYTHONPATH=folder)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def run_tool(driver: str, paths: list[str], folder: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=folder)
    proc = subprocess.run([sys.executable, "-c", driver, json.dumps(paths)], capture_output=True, text=True,
                          env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"scanner driver failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_ckpt(paths: list[str]) -> dict[str, str]:
    from ckpt_tool import scan

    out = {}
    for path in paths:
        report = scan([path])
        verdicts = {f.verdict for f in report.files}
        out[path] = ("detected" if "dangerous" in verdicts else "error" if "error" in verdicts
                     else "suspicious" if "suspicious" in verdicts else "missed")
    return out


def clean_paths(tmp: str) -> list[tuple[str, str]]:
    """The committed clean fixtures, plus a state_dict written with plain pickle.dump."""
    import pickle

    import torch

    fixtures = os.path.join(ROOT, "fixtures")
    names = ["tiny_mlp.pth", "tiny_mlp.safetensors", "legacy.pth", "training.pth", "lightning.ckpt",
             "whole_model.pth", "torchscript.pt", "numpy_dict.pkl", "dill_model.dill", "sharded_bin", "dcp"]
    out = [(n, os.path.join(fixtures, n)) for n in names if os.path.exists(os.path.join(fixtures, n))]
    plain = os.path.join(tmp, "state_dict_pickle.pkl")
    with open(plain, "wb") as f:
        pickle.dump(torch.load(os.path.join(fixtures, "tiny_mlp.pth"), weights_only=True), f)
    return out + [("state_dict_pickle.pkl", plain)]


def table(rows: list[tuple[str, str, dict[str, str]]], tools: list[str], clean: bool) -> str:
    good = ("missed", "suspicious") if clean else ("detected",)
    head = "| case | what it tests | " + " | ".join(tools) + " |"
    lines = [head, "|" + " --- |" * (len(tools) + 2)]
    totals = dict.fromkeys(tools, 0)
    for name, note, cells in rows:
        shown = []
        for t in tools:
            v = cells[t]
            if v in good:
                totals[t] += 1
            label = {"missed": "clean", "detected": "**false alarm**"}.get(v, v) if clean else \
                {"detected": "detected", "missed": "**missed**"}.get(v, v)
            shown.append(label)
        lines.append(f"| `{name}` | {note} | " + " | ".join(shown) + " |")
    what = "no false alarm (clean or suspicious)" if clean else "detected"
    lines.append(f"| **total** | {what} | " + " | ".join(f"**{totals[t]}/{len(rows)}**" for t in tools) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="pip install picklescan and fickling first")
    parser.add_argument("--scanners-dir", default=DEFAULT_DIR, help="where picklescan and fickling are installed")
    parser.add_argument("--markdown", default=None, help="also write the tables to this file")
    args = parser.parse_args(argv)
    if args.install:
        install(args.scanners_dir)
    vers = versions(args.scanners_dir)
    if not vers:
        raise SystemExit(f"picklescan/fickling not found in {args.scanners_dir}; run with --install")
    from malicious import build_corpus

    from ckpt_tool import __version__

    with tempfile.TemporaryDirectory() as tmp:
        cases = build_corpus(os.path.join(tmp, "corpus"))
        paths = [c.path for c in cases]
        clean = clean_paths(tmp)
        every = paths + [p for _, p in clean]
        results = {
            f"ckpt {__version__}": run_ckpt(every),
            f"picklescan {vers['picklescan']}": run_tool(PICKLESCAN, every, args.scanners_dir),
            f"fickling {vers['fickling']}": run_tool(FICKLING, every, args.scanners_dir),
        }
        ran = [c.name for c in cases if os.path.exists(c.marker)]
        if ran:
            raise SystemExit(f"a scanner ran payloads: {ran}")
    tools = list(results)
    bad_rows = [(c.name, c.note, {t: results[t][c.path] for t in tools}) for c in cases]
    clean_rows = [(n, "clean fixture" if "fixtures" in p else "pickle.dump(state_dict)",
                   {t: results[t][p] for t in tools}) for n, p in clean]
    text = ("### Malicious corpus (tests/helpers/malicious.py)\n\n" + table(bad_rows, tools, clean=False)
            + "\n\n### Clean checkpoints (fixtures/)\n\n" + table(clean_rows, tools, clean=True) + "\n")
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
