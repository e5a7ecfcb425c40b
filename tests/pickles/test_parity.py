"""Loader parity (issue 13): ckpt agrees with what torch.load and safetensors do with each file.

The corpus (tests/hostile/generate.py) is built once; tests/helpers/reference_loaders.py
records, in one subprocess, what torch.load(weights_only=True/False),
safetensors' safe_open and pickle.load do with every case, and whether a
payload ran (its marker file appeared). ckpt then runs once per command over
the batch (inspect once per file, in-process) and each case asserts:

(a) a file some reference loader reads cleanly (without running a payload)
    is readable by ``ckpt inspect`` (exit 0), unless it is dangerous (a payload
    ran somewhere, the case hides a call ckpt must flag, or it has the shape of
    a public weights_only advisory);
(b) a file every reference loader refuses (no payload having run) makes ``ckpt inspect`` exit 2,
    fails ``ckpt gate``, and is not "safe" to ``ckpt scan`` (exit 1 or 2);
(c) a file whose payload ran under any loader makes ``ckpt scan`` exit 1
    naming the call (module.name in ``globals``, severity dangerous), fails
    ``ckpt gate``, and ``ckpt inspect`` warns (exit 0) or errs (exit 2) naming it (a folder inspect
    reads, exit 0, must name it too: issue 32);
(d) ``ckpt scan`` of a folder holding nothing any loader reads exits 2;
(e) a benign case (``BENIGN_CLASSES``: ordinary torch features written by
    ``torch.save``, issue 21) is not flagged: scan's verdict is not dangerous,
    gate's ``loads_safely`` check passes, inspect exits 0 with no dangerous
    warning; and ``torch.load(weights_only=False)`` loads it without a marker;
and ckpt never creates a marker. Besides torch.load, safetensors and pickle.load,
the reference runs the loaders a file's name or bytes select (np.load of
``.npy``/``.npz``, torch.jit.load, torch.package's PackageImporter, DCP's
FileSystemReader, the shards an index names) and the exit hooks a payload
registered; a malicious case's marker must appear under one of them
(``test_every_payload_is_live``), so "runs code" is always measured. Folders are judged by the files in them;
FIFOs and devices are "refused (hangs)" by construction and never opened by
the reference loaders (ckpt runs on them in a subprocess with a timeout).

Reference verdicts are measured here, never written down. Set PARITY_DUMP=FILE
to write every measurement as JSON (tests/hostile/report.py turns that into
DISAGREEMENTS.md).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `tests.hostile` is imported as a package from the repository root
    sys.path.insert(0, str(ROOT))

from tests.hostile.generate import BENIGN_CLASSES, Case, build  # noqa: E402

CKPT_TIMEOUT_S = 30

# The corpus is needed to name the test ids, so it is built at collection (about 4 s).
_CORPUS_DIR = tempfile.mkdtemp(prefix="ckpt-hostile-")
atexit.register(shutil.rmtree, _CORPUS_DIR, True)
CASES: list[Case] = build(_CORPUS_DIR)
BY_NAME = {c.name: c for c in CASES}
# Every loader step of tests/helpers/reference_loaders.py; ``at_exit`` only ever says ``ran`` (its ``ok`` is None).
STEPS = ("wo_true", "safetensors", "pickle", "numpy", "jit", "package", "dcp", "index", "wo_false", "at_exit")


# ------------------------------------------------------------------ running things


class _Hang(BaseException):
    """Raised by the alarm: a BaseException so no ``except Exception`` in ckpt swallows it."""


class _Main:
    def __init__(self, main: Any) -> None:
        self.main_func = main
        self.name = "ckpt"

    def main(self, args: Any = None, prog_name: Any = None, standalone_mode: bool = True, **extra: Any) -> None:
        sys.exit(self.main_func(args))


def _ckpt(*args: str) -> dict[str, Any]:
    """``ckpt ARGS`` in-process; a hang or crash becomes a result, not a lost session."""
    from ckpt_tool.cli import main

    def on_alarm(signum: int, frame: Any) -> None:
        raise _Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CKPT_TIMEOUT_S)
    try:
        r = CliRunner().invoke(_Main(main), list(args), catch_exceptions=True)
        res = {"code": r.exit_code, "out": r.stdout, "err": r.stderr}
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            res["code"] = "crash"
            res["err"] += f"\n{type(r.exception).__name__}: {r.exception}"
    except _Hang:
        res = {"code": "timeout", "out": "", "err": f"no answer in {CKPT_TIMEOUT_S} s"}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    try:
        res["json"] = json.loads(res["out"]) if res["out"].strip() else None
    except ValueError:
        res["json"] = None
    return res


def _ckpt_subprocess(*args: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, "-m", "ckpt_tool", *args], check=False, capture_output=True, text=True,
                           timeout=CKPT_TIMEOUT_S, env=env, cwd=tempfile.gettempdir())
        res: dict[str, Any] = {"code": p.returncode, "out": p.stdout, "err": p.stderr}
    except subprocess.TimeoutExpired:
        res = {"code": "timeout", "out": "", "err": f"no answer in {CKPT_TIMEOUT_S} s"}
    try:
        res["json"] = json.loads(res["out"]) if res["out"].strip() else None
    except ValueError:
        res["json"] = None
    return res


def _markers() -> set[str]:
    return set(os.listdir(os.path.join(_CORPUS_DIR, "markers")))


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("reference-work")
    manifest = work / "manifest.json"
    results = work / "results.jsonl"
    manifest.write_text(json.dumps([
        {"name": c.name, "path": c.path, "kind": c.kind, "marker": c.marker, "cls": c.cls} for c in CASES
    ]))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    loaders = ROOT / "tests" / "helpers" / "reference_loaders.py"
    subprocess.run([sys.executable, str(loaders), str(manifest), str(results)],
                   cwd=work, env=env, check=True, timeout=900, capture_output=True)
    out = {}
    for line in results.read_text().splitlines():
        rec = json.loads(line)
        out[rec["name"]] = rec
    leftover = _markers()
    assert not leftover, f"the reference loader left markers behind: {sorted(leftover)}"
    return out


@pytest.fixture(scope="module")
def ckpt_results(reference: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every ckpt answer: inspect per case, scan and gate once over the files, per folder/special file."""
    before = _markers()
    files = [c for c in CASES if c.kind == "file"]
    res: dict[str, dict[str, Any]] = {c.name: {} for c in CASES}
    for c in CASES:
        run = _ckpt_subprocess if c.kind == "special" else _ckpt
        res[c.name]["inspect"] = run("inspect", "--json", c.path)
    strict = _ckpt("gate", "--strict", "--json", *[c.path for c in files])
    strict_by_path = {e.get("path"): e for e in (strict["json"] or {}).get("files", [])} \
        if isinstance(strict["json"], dict) else {}
    for c in files:
        res[c.name]["gate_strict"] = strict_by_path.get(c.path)
    for command in ("scan", "gate"):
        batch = _ckpt(command, "--json", *[c.path for c in files])
        per_path = {}
        if isinstance(batch["json"], dict):
            for entry in batch["json"].get("files", []):
                per_path.setdefault(entry.get("path"), entry)
        for c in files:
            entry = per_path.get(c.path)
            if entry is None:  # not in the batch answer (or the batch crashed): ask for this file alone
                single = _ckpt(command, "--json", c.path)
                entry = (single["json"] or {}).get("files", [None])[0] if isinstance(single["json"], dict) else None
                res[c.name][command] = {"code": single["code"], "entry": entry, "err": single["err"],
                                        "json": single["json"], "batch": False}
            else:
                res[c.name][command] = {"code": _code_from_entry(command, entry), "entry": entry,
                                        "json": None, "err": "", "batch": True}
    for c in CASES:
        if c.kind in ("folder", "special"):
            run = _ckpt_subprocess if c.kind == "special" else _ckpt
            for command in ("scan", "gate"):
                r = run(command, "--json", c.path)
                res[c.name][command] = {"code": r["code"], "entry": None, "json": r["json"], "err": r["err"],
                                        "batch": False}
    created = sorted(_markers() - before)
    for m in created:
        os.remove(os.path.join(_CORPUS_DIR, "markers", m))
    out = {"cases": res, "markers_created_by_ckpt": created}
    dump = os.environ.get("PARITY_DUMP")
    if dump:
        with open(dump, "w") as f:
            json.dump({"reference": reference, "ckpt": out,
                       "cases": [{**c.__dict__, "extra": None} for c in CASES]}, f, default=str)
    return out


def _code_from_entry(command: str, entry: dict[str, Any]) -> int:
    """The exit code ckpt gives this one file (its verdict in the batch document)."""
    if command == "scan":
        return {"dangerous": 1, "error": 2}.get(entry.get("verdict"), 0)
    if entry.get("error"):
        return 2
    return 0 if entry.get("passed") else 1


# ------------------------------------------------------------------ verdicts


def reference_verdict(case: Case, ref: dict[str, Any]) -> dict[str, Any]:
    """ran / reads_clean / refused_all for a case, from the measurements."""
    if case.kind == "special":
        return {"ran": False, "reads_clean": False, "refused_all": True, "why": ref.get("skipped", "")}
    step_sets = list(ref.get("files", {}).values()) if case.kind == "folder" else [ref.get("steps", {})]
    ran = any(s.get(k, {}).get("ran") for s in step_sets for k in STEPS)
    clean = any(s.get(k, {}).get("ok") and not s.get(k, {}).get("ran") for s in step_sets for k in STEPS)
    ok_any = any(s.get(k, {}).get("ok") for s in step_sets for k in STEPS)
    return {"ran": ran, "reads_clean": clean, "refused_all": not ok_any, "timed_out": ref.get("timed_out")}


def _dangerous_names(entry_or_doc: Any) -> set[str]:
    names = set()
    docs = [entry_or_doc] if isinstance(entry_or_doc, dict) else []
    if isinstance(entry_or_doc, dict) and "files" in entry_or_doc:
        docs = entry_or_doc["files"]
    for d in docs:
        for g in (d or {}).get("globals", []):
            if g.get("severity") == "dangerous":
                names.add(f"{g.get('module')}.{g.get('name')}")
    return names


def _scan_names(scan: dict[str, Any]) -> set[str]:
    return _dangerous_names(scan["entry"] if scan["entry"] is not None else scan["json"])


def _names_call(found: set[str], calls: tuple[str, ...]) -> bool:
    return bool(found) and (not calls or bool(found & set(calls)))


def _refused_as_promised(case: Case, scan: dict[str, Any]) -> bool:
    """scan exits 2 with an error containing ``case.error_ok``: as good as naming the call (gate must still fail)."""
    if not case.error_ok or scan["code"] != 2:
        return False
    text = json.dumps(scan["entry"] if scan["entry"] is not None else scan["json"]) + scan.get("err", "")
    return case.error_ok in text.lower()


def _gate_failed(gate: dict[str, Any]) -> bool:
    return gate["code"] in (1, 2)


def parity_problems(case: Case, ref: dict[str, Any], ck: dict[str, Any]) -> list[str]:
    v = reference_verdict(case, ref)
    ins, scan, gate = ck["inspect"], ck["scan"], ck["gate"]
    problems = _read_problems(case, v, ck) if case.kind != "folder" else []
    if v["ran"]:
        problems += _ran_problems(case, ins, scan, gate)
    if case.kind == "folder" and v["refused_all"] and scan["code"] != 2:
        problems.append(f"(d) nothing in the folder is readable but scan exits {scan['code']}")
    if case.cls in BENIGN_CLASSES:
        problems += benign_problems(case, ref, ck)
    return problems


def _read_problems(case: Case, v: dict[str, Any], ck: dict[str, Any]) -> list[str]:
    """(a) and (b), for a file: what the reference loaders read or refuse, ckpt reads or refuses."""
    ins, scan, gate = ck["inspect"], ck["scan"], ck["gate"]
    dangerous = v["ran"] or bool(case.flag) or bool(case.advisory)
    problems = []
    if v["reads_clean"] and not dangerous and ins["code"] != 0:
        problems.append(f"(a) a reference loader reads it cleanly but inspect exits {ins['code']}: "
                        f"{ins['err'].strip()[:300]}")
    if v["refused_all"] and not v["ran"]:  # a payload that ran and then broke the load: (c) decides
        if ins["code"] != 2:
            problems.append(f"(b) every reference loader refuses it but inspect exits {ins['code']}")
        if not _gate_failed(gate):
            problems.append(f"(b) every reference loader refuses it but gate passes (exit {gate['code']})")
        if scan["code"] == 0:
            problems.append("(b) every reference loader refuses it but scan calls it safe (exit 0)")
    return problems


def _ran_problems(case: Case, ins: dict[str, Any], scan: dict[str, Any], gate: dict[str, Any]) -> list[str]:
    """(c): a payload ran under a reference loader, so scan, gate and inspect must each say so."""
    problems = []
    names = _scan_names(scan)
    if (scan["code"] != 1 or not _names_call(names, case.calls)) and not _refused_as_promised(case, scan):
        problems.append(f"(c) the payload ran but scan exits {scan['code']} naming {sorted(names) or 'nothing'}"
                        f" (expected one of {list(case.calls) or 'any dangerous global'})")
    if not _gate_failed(gate):
        problems.append(f"(c) the payload ran but gate passes (exit {gate['code']})")
    text = ins["out"] + ins["err"]
    named = any(c in text for c in case.calls) if case.calls else ("danger" in text.lower())
    if case.kind != "folder" and (ins["code"] not in (0, 2) or not named):
        problems.append(f"(c) the payload ran but inspect exits {ins['code']} "
                        f"{'without naming' if not named else 'naming'} {list(case.calls)}: "
                        f"{ins['err'].strip()[:200]}")
    if case.kind == "folder" and ins["code"] == 0 and not named:  # inspect judges what the folder's loader opens
        problems.append(f"(c) the payload ran but inspect reads the folder without naming {list(case.calls)}")
    return problems


def _gate_check(gate: dict[str, Any], name: str) -> dict[str, Any] | None:
    entry = gate.get("entry") or {}
    return next((ch for ch in entry.get("checks", []) if ch.get("name") == name), None)


def benign_problems(case: Case, ref: dict[str, Any], ck: dict[str, Any]) -> list[str]:
    """(e): a benign feature is loaded by torch without running anything and is not flagged by ckpt."""
    out = []
    wo_false = ref.get("steps", {}).get("wo_false", {})
    if reference_verdict(case, ref)["ran"]:
        out.append("(e) not a valid benign case: a reference loader ran a payload")
    elif not wo_false.get("ok"):
        out.append(f"(e) not a valid benign case: torch.load(weights_only=False) refused: "
                   f"{wo_false.get('error', '')[-200:]}")
    scan, gate, ins = ck["scan"], ck["gate"], ck["inspect"]
    if scan["code"] == 1 or (scan.get("entry") or {}).get("verdict") == "dangerous":
        out.append(f"(e) benign but scan calls it dangerous naming {sorted(_scan_names(scan))}")
    loads = _gate_check(gate, "loads-safely")
    if loads is None or not loads.get("passed"):
        detail = (loads or {}).get("detail", gate.get("err", ""))
        out.append(f"(e) benign but gate's loads_safely fails: {detail[:300]}")
    warns = " ".join(map(str, ((ins.get("json") or {}).get("warnings") or [])))
    if ins["code"] != 0 or "dangerous" in warns.lower():
        out.append(f"(e) benign but inspect exits {ins['code']}"
                   + (f" warning {warns[:300]}" if warns else f": {ins['err'].strip()[:300]}"))
    return out


# ------------------------------------------------------------------ tests


# Deliberate differences: each is listed, with its reason, in docs/security.md (checked below), and the
# difference must stay exactly the rule named here (anything else is a regression).
DELIBERATE = {
    # torch cannot import the class's module here, so every loader fails; the contract reads unknown classes
    # as inert placeholders, which is what lets ckpt inspect and migrate such files without their code.
    "wo_unimportable_class": "(b)",
    # torch.jit.load refuses it here only because no extension library registered the operator's namespace in
    # the reference process; where one has, it loads and runs the operator. ckpt reads it and names the call.
    "torchscript_custom_op": "(b)",
}


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_parity(name: str, reference: dict[str, Any], ckpt_results: dict[str, Any]) -> None:
    case = BY_NAME[name]
    problems = parity_problems(case, reference[name], ckpt_results["cases"][name])
    if name in DELIBERATE:
        docs = (ROOT / "docs" / "security.md").read_text()
        assert f"`{name}`" in docs, f"{name} differs deliberately but docs/security.md does not say why"
        assert problems and all(p.startswith(DELIBERATE[name]) for p in problems), problems
        return
    assert not problems, f"{name} ({case.cls}: {case.note}):\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("name", [c.name for c in CASES if c.marker])
def test_every_payload_is_live(name: str, reference: dict[str, Any]) -> None:
    """A malicious case is one whose payload runs under some reference loader: measured, never assumed."""
    case = BY_NAME[name]
    assert reference_verdict(case, reference[name])["ran"], (
        f"{name}: its marker never appeared under any reference loader; fix or drop the case")


@pytest.mark.parametrize("name", [c.name for c in CASES if c.cls in BENIGN_CLASSES])
def test_benign_case_is_valid(name: str, reference: dict[str, Any]) -> None:
    """A benign case loads under torch.load(weights_only=False) and runs nothing."""
    ref = reference[name]
    assert ref["steps"]["wo_false"]["ok"], ref["steps"]["wo_false"]
    assert not reference_verdict(BY_NAME[name], ref)["ran"]


def test_ckpt_never_runs_a_payload(ckpt_results: dict[str, Any]) -> None:
    assert ckpt_results["markers_created_by_ckpt"] == []


@pytest.mark.parametrize("name", [c.name for c in CASES if c.kind == "file"])
def test_strict_gate_fails_where_inspect_warns(name: str, ckpt_results: dict[str, Any]) -> None:
    """One set of warnings: whatever inspect warns about, `gate --strict` fails on."""
    ck = ckpt_results["cases"][name]
    doc = ck["inspect"]["json"]
    if ck["inspect"]["code"] != 0 or not isinstance(doc, dict) or not doc.get("warnings"):
        return
    entry = ck["gate_strict"]
    assert entry is not None and not entry.get("passed"), (
        f"{name}: inspect warns {doc['warnings'][:2]} but gate --strict passes")


@pytest.mark.parametrize("name", [c.name for c in CASES if c.flag])
def test_hidden_calls_are_named(name: str, ckpt_results: dict[str, Any]) -> None:
    """A call no stock loader runs (a member torch never reads) is still named by scan (exit 1)."""
    case = BY_NAME[name]
    scan = ckpt_results["cases"][name]["scan"]
    names = _scan_names(scan)
    assert scan["code"] == 1 and names & set(case.flag), (
        f"{name}: scan exits {scan['code']} naming {sorted(names)}; expected one of {list(case.flag)}")


@pytest.mark.parametrize("name", [c.name for c in CASES if c.advisory])
def test_advisory_is_named(name: str, ckpt_results: dict[str, Any]) -> None:
    """A file shaped like a public weights_only advisory is reported naming the advisory."""
    case = BY_NAME[name]
    ck = ckpt_results["cases"][name]
    assert case.advisory in json.dumps(ck["scan"]["entry"] or ck["scan"]["json"]), f"{name}: scan does not name it"
    assert case.advisory in ck["inspect"]["out"] + ck["inspect"]["err"], f"{name}: inspect does not name it"


def _torch_name(name: str) -> str:
    return name if "." in name else f"builtins.{name}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.kind == "file"])
def test_weights_only_prediction(name: str, reference: dict[str, Any], ckpt_results: dict[str, Any]) -> None:
    """Issue 15: inspect's ``weights_only.loads`` is what torch.load(weights_only=True) did."""
    wo = reference[name].get("steps", {}).get("wo_true")
    ins = ckpt_results["cases"][name]["inspect"]
    if wo is None or ins["code"] != 0:
        return  # no measurement, or nothing to compare: inspect's own verdict is test_parity's business
    doc = ins["json"] or {}
    pred = doc.get("weights_only")
    assert isinstance(pred, dict), f"{name}: inspect --json has no weights_only object"
    assert pred.get("loads") == wo["ok"], (
        f"{name}: ckpt says loads={pred.get('loads')}, torch.load(weights_only=True) "
        f"{'loaded it' if wo['ok'] else 'refused: ' + wo.get('error', '')[-300:]}")
    first = [_torch_name(n) for n in wo.get("needs_first", [])]
    if first:
        assert set(first) & {_torch_name(n) for n in pred.get("needs", [])}, (
            f"{name}: torch refused {first[0]}, ckpt's needs are {pred.get('needs')}")
