"""The table of docs/security.md: per class of hostile case, what torch, safetensors, picklescan and ckpt do.

    PARITY_DUMP=/tmp/parity.json python -m pytest -q -p no:cacheprovider tests/test_parity.py
    python -m tests.hostile.security_table /tmp/parity.json --picklescan /path/to/venv/bin/python > table.md

The torch, safetensors and ckpt columns come from the dump (measured by
tests/test_parity.py). picklescan is a baseline, never a dependency of ckpt:
``--picklescan PYTHON`` names an interpreter that can import it; the corpus is
rebuilt with the same generator into a temporary folder (the dump's own folder
is gone by then) and picklescan runs once per case, as its command line would
(exit 0 clean, 1 dangerous globals, 2 a scan error), in a subprocess with a
timeout (a FIFO blocks it). Without ``--picklescan`` that column says "not run".
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from tests.hostile.generate import CLASSES, Case, build
from tests.test_parity import DELIBERATE, _scan_names, parity_problems, reference_verdict

PICKLESCAN_TIMEOUT_S = 20
# Run by the picklescan interpreter: the decision of picklescan's own CLI (cli.main), as JSON.
_PICKLESCAN_DRIVER = r"""
import json, logging, os, sys
logging.disable(logging.CRITICAL)
from picklescan.scanner import scan_directory_path, scan_file_path
path = sys.argv[1]
try:
    r = scan_directory_path(path) if os.path.isdir(path) else scan_file_path(path)
    code = 2 if r.scan_err else (0 if r.issues_count == 0 else 1)
    out = {"code": code, "dangerous": sorted({f"{g.module}.{g.name}" for g in r.globals
                                              if g.safety.value == "dangerous"}),
           "suspicious": r.suspicious_count}
except Exception as exc:
    out = {"code": 2, "dangerous": [], "suspicious": 0, "error": f"{type(exc).__name__}: {exc}"[:200]}
sys.stdout.write(json.dumps(out))
"""

COLUMNS = (
    ("wo_true", "torch.load(weights_only=True)"),
    ("wo_false", "torch.load(weights_only=False)"),
    ("safetensors", "safetensors safe_open"),
    ("picklescan", "picklescan"),
    ("inspect", "ckpt inspect"),
    ("scan", "ckpt scan"),
    ("gate", "ckpt gate"),
)
# The order outcomes are listed in a cell: the harmful ones first.
ORDER = ("payload runs", "dangerous", "reads, warns dangerous", "fails", "suspicious", "loads", "reads", "clean",
         "safe", "passes", "refuses", "error", "hangs", "nothing to load", "n/a", "not run")


# ------------------------------------------------------------------ one outcome per case and column


def _step_outcome(steps: list[dict[str, Any]], key: str) -> str:
    found = [s[key] for s in steps if key in s]
    if not found:
        return "nothing to load"
    if any(s.get("ran") for s in found):
        return "payload runs"
    return "loads" if any(s.get("ok") for s in found) else "refuses"


def reference_outcome(case: Case, ref: dict[str, Any], key: str) -> str:
    """What one reference loader did: payload runs / loads / refuses / hangs (/ n/a for safetensors)."""
    if case.kind == "special":
        return "hangs"  # never opened: torch.load and safe_open block on a FIFO or a device
    if ref.get("timed_out"):
        return "hangs"
    steps = list(ref.get("files", {}).values()) if case.kind == "folder" else [ref.get("steps", {})]
    out = _step_outcome(steps, key)
    if key == "safetensors" and out == "refuses":
        # safe_open refuses every pickle: that says something only about files that claim to be safetensors
        claims = case.path.endswith(".safetensors") or any(
            rel.endswith(".safetensors") for rel in ref.get("files", {}))
        return out if claims else "n/a"
    return out


def picklescan_outcome(res: dict[str, Any] | None) -> str:
    if res is None:
        return "not run"
    if res.get("timeout"):
        return "hangs"
    if res["dangerous"]:
        return "dangerous"
    if res["code"] == 2:
        return "error"
    return "suspicious" if res["suspicious"] else "clean"


def ckpt_outcome(ck: dict[str, Any], command: str) -> str:
    r = ck[command]
    code = r["code"]
    if code == "timeout":
        return "hangs"
    if code == "crash":
        return "crash"
    if command == "inspect":
        if code == 0:
            warns = " ".join(map(str, ((r.get("json") or {}).get("warnings") or [])))
            return "reads, warns dangerous" if "dangerous" in warns.lower() else "reads"
        return "refuses" if code == 2 else f"exit {code}"
    if command == "scan":
        verdict = (r.get("entry") or {}).get("verdict")
        if verdict is None:
            verdict = {0: "safe", 1: "dangerous", 2: "error"}.get(code, f"exit {code}")
        return str(verdict)
    return {0: "passes", 1: "fails", 2: "error"}.get(code, f"exit {code}")


# ------------------------------------------------------------------ picklescan


def run_picklescan(python: str, cases: list[Case]) -> dict[str, dict[str, Any]]:
    """picklescan on a fresh build of the corpus, one subprocess per case."""
    folder = tempfile.mkdtemp(prefix="ckpt-hostile-picklescan-")
    try:
        rebuilt = {c.name: c for c in build(folder)}
        out: dict[str, dict[str, Any]] = {}
        for case in cases:
            path = rebuilt[case.name].path if case.name in rebuilt else None
            if path is None:
                continue
            try:
                p = subprocess.run([python, "-c", _PICKLESCAN_DRIVER, path], check=False, capture_output=True,
                                   text=True, timeout=PICKLESCAN_TIMEOUT_S, cwd=folder)
                out[case.name] = json.loads(p.stdout) if p.stdout.strip() else {
                    "code": 2, "dangerous": [], "suspicious": 0, "error": p.stderr.strip()[-200:]}
            except subprocess.TimeoutExpired:
                out[case.name] = {"code": "timeout", "timeout": True, "dangerous": [], "suspicious": 0}
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------------ rendering


def _count_cell(outcomes: list[str]) -> str:
    counts = collections.Counter(outcomes)
    keys = sorted(counts, key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))
    return " · ".join(f"{k} {counts[k]}" for k in keys)


def _hidden_or_ran(case: Case, ref: dict[str, Any]) -> bool:
    """A call runs under some loader, or the case hides one ckpt must name (``flag``)."""
    return reference_verdict(case, ref)["ran"] or bool(case.flag)


def _names_advisory(case: Case, ck: dict[str, Any]) -> bool:
    """As test_parity.test_advisory_is_named: scan's entry or inspect's output names the advisory."""
    text = json.dumps(ck["scan"]["entry"] or ck["scan"]["json"]) + ck["inspect"]["out"] + ck["inspect"]["err"]
    return bool(case.advisory) and str(case.advisory) in text


def _summary(cases: list[Case], refs: dict[str, Any], cks: dict[str, Any], rows: dict[str, dict[str, str]],
             ps: bool) -> list[str]:
    """The headline: dangerous cases each scanner flags, harmless ones it flags by mistake."""
    def ps_count(group: list[Case], *outcomes: str) -> int:
        return sum(rows[c.name]["picklescan"] in outcomes for c in group)

    calls = [c for c in cases if _hidden_or_ran(c, refs[c.name])]
    ran = [c for c in calls if reference_verdict(c, refs[c.name])["ran"]]
    named = [c for c in calls if cks[c.name]["scan"]["code"] == 1
             and (_scan_names(cks[c.name]["scan"]) & set(c.calls + c.flag) or not (c.calls or c.flag))]
    adv = [c for c in cases if c.advisory and not _hidden_or_ran(c, refs[c.name])]
    adv_named = [c for c in adv if _names_advisory(c, cks[c.name])]
    adv_fail = [c for c in adv if cks[c.name]["scan"]["code"] == 1]
    harmless = [c for c in cases if not _hidden_or_ran(c, refs[c.name]) and not c.advisory]
    clean = [c for c in harmless if reference_verdict(c, refs[c.name])["reads_clean"]]
    ck_false = [c for c in clean if cks[c.name]["scan"]["code"] == 1]
    refused = [c for c in harmless if c.kind != "folder" and reference_verdict(c, refs[c.name])["refused_all"]]
    ck_ok = [c for c in refused if rows[c.name]["scan"] in ("safe", "suspicious")]
    agree = sum(r["parity"] == "agrees" for r in rows.values())
    differ = [n for n, r in rows.items() if r["parity"] == "DIFFERS"]

    def names(group: list[Case]) -> str:
        return " (" + ", ".join(f"`{c.name}`" for c in group) + ")" if group else ""

    return [
        f"- **Calls that run**: in {len(calls)} cases a call runs under some loader ({len(ran)}) or hides where no "
        f"stock loader reaches it ({len(calls) - len(ran)}). ckpt scan exits 1 naming the call on {len(named)}"
        + (f"; picklescan flags {ps_count(calls, 'dangerous')}, calls {ps_count(calls, 'clean', 'suspicious')} "
           f"clean or suspicious, errs on {ps_count(calls, 'error', 'hangs')}." if ps else "."),
        f"- **Advisory shapes** (no call runs under torch 2.13): {len(adv)} cases; ckpt names the advisory on "
        f"{len(adv_named)} and fails the scan on {len(adv_fail)} (CVE-2026-24747 is dangerous, a clean TorchScript "
        f"or tar file is informational)" + (f"; picklescan flags {ps_count(adv, 'dangerous')}." if ps else "."),
        f"- **Harmless files some loader reads** ({len(clean)}): ckpt scan calls {len(ck_false)} dangerous"
        f"{names(ck_false)}" + (f"; picklescan {ps_count(clean, 'dangerous')}." if ps else "."),
        f"- **Harmless files every loader refuses** ({len(refused)}): ckpt scan calls {len(ck_ok)} safe or "
        f"suspicious{names(ck_ok)}" + (f"; picklescan {ps_count(refused, 'clean', 'suspicious')}." if ps else "."),
        f"- **Loader parity** (tests/test_parity.py): {agree} of {len(cases)} cases agree; deliberate: "
        + ", ".join(f"`{n}`" for n in DELIBERATE) + "; differing: " + (", ".join(f"`{n}`" for n in differ) or "none")
        + ".",
    ]


def render(dump: dict[str, Any], picklescan: dict[str, dict[str, Any]] | None) -> str:
    cases = [Case(**{**c, "calls": tuple(c["calls"]), "flag": tuple(c["flag"]), "extra": {}}) for c in dump["cases"]]
    refs, cks = dump["reference"], dump["ckpt"]["cases"]
    rows: dict[str, dict[str, str]] = {}
    for c in cases:
        ref, ck = refs[c.name], cks[c.name]
        row = {key: reference_outcome(c, ref, key) for key in ("wo_true", "wo_false", "safetensors")}
        row["picklescan"] = picklescan_outcome(None if picklescan is None else picklescan.get(c.name))
        row.update({cmd: ckpt_outcome(ck, cmd) for cmd in ("inspect", "scan", "gate")})
        problems = parity_problems(c, ref, ck)
        row["parity"] = "deliberate" if c.name in DELIBERATE else ("agrees" if not problems else "DIFFERS")
        rows[c.name] = row

    by_class: dict[str, list[Case]] = collections.defaultdict(list)
    for c in cases:
        by_class[c.cls].append(c)
    header = "| class | cases | " + " | ".join(label for _, label in COLUMNS) + " | parity |"
    lines = [header, "|" + " --- |" * (len(COLUMNS) + 3)]
    for cls in [k for k in CLASSES if k in by_class]:
        group = by_class[cls]
        cells = [_count_cell([rows[c.name][key] for c in group]) for key, _ in COLUMNS]
        agree = sum(rows[c.name]["parity"] == "agrees" for c in group)
        parity = f"{agree}/{len(group)}" + (f" (+{len(group) - agree} deliberate)" if all(
            rows[c.name]["parity"] != "DIFFERS" for c in group) and agree < len(group) else "")
        lines.append(f"| {cls} | {len(group)} | " + " | ".join(cells) + f" | {parity} |")
    total_agree = sum(r["parity"] == "agrees" for r in rows.values())
    lines.append(f"| **all** | **{len(cases)}** | " + " | ".join(
        _count_cell([rows[c.name][key] for c in cases]) for key, _ in COLUMNS) + f" | **{total_agree}/{len(cases)}** |")

    summary = _summary(cases, refs, cks, rows, picklescan is not None)

    appendix = ["| case | class | " + " | ".join(label for _, label in COLUMNS) + " | parity |",
                "|" + " --- |" * (len(COLUMNS) + 3)]
    for c in cases:
        r = rows[c.name]
        appendix.append(f"| `{c.name}` | {c.cls} | " + " | ".join(r[key] for key, _ in COLUMNS) + f" | {r['parity']} |")
    return "\n".join([
        "<!-- generated by tests/hostile/security_table.py; do not edit by hand -->",
        *summary, "", *lines, "",
        "<details><summary>Every case</summary>", "", *appendix, "", "</details>", "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dump", help="the PARITY_DUMP written by tests/test_parity.py")
    parser.add_argument("--picklescan", metavar="PYTHON", help="an interpreter that can import picklescan")
    parser.add_argument("--picklescan-json", metavar="FILE",
                        help="read picklescan's results from FILE if it exists, else write them there")
    args = parser.parse_args(argv)
    with open(args.dump) as f:
        dump = json.load(f)
    results = None
    if args.picklescan_json and os.path.exists(args.picklescan_json):
        with open(args.picklescan_json) as f:
            results = json.load(f)
    elif args.picklescan:
        cases = [Case(**{**c, "calls": tuple(c["calls"]), "flag": tuple(c["flag"]), "extra": {}})
                 for c in dump["cases"]]
        results = run_picklescan(args.picklescan, cases)
        if args.picklescan_json:
            with open(args.picklescan_json, "w") as f:
                json.dump(results, f, indent=1)
    sys.stdout.write(render(dump, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
