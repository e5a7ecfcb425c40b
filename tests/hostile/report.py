"""Turn a PARITY_DUMP (see tests/pickles/test_parity.py) into the DISAGREEMENTS.md table.

    PARITY_DUMP=/tmp/parity.json python -m pytest -q tests/pickles/test_parity.py
    python -m tests.hostile.report /tmp/parity.json > tests/hostile/DISAGREEMENTS.md
"""
from __future__ import annotations

import collections
import json
import os
import sys
from typing import Any

from tests.hostile.generate import Case
from tests.pickles.test_parity import parity_problems

STEPS = (("wo_true", "torch wo=True"), ("wo_false", "torch wo=False"), ("safetensors", "safe_open"),
         ("pickle", "pickle.load"), ("numpy", "np.load"), ("jit", "torch.jit.load"), ("package", "PackageImporter"),
         ("dcp", "DCP read_metadata"), ("index", "index shards"), ("at_exit", "exit hooks"))


NOTES = """\
## Notes for whoever fixes these

- Deliberate (listed in `test_parity.DELIBERATE` and, with its reason, in docs/security.md):
  `wo_unimportable_class` (torch.load cannot import `mylab.configs` here, so every loader refuses; the
  contract says ckpt reads unknown classes as inert placeholders, so inspect exit 0 is the promised
  behaviour).
- What torch 2.13 accepts that one might not expect: members under `..` (`../data.pkl`) and under an
  empty prefix (`/data.pkl`); upper-cased member names (`ARCHIVE/DATA.PKL`: the lookup is
  case-insensitive); local-header sizes, names and CRCs that disagree with the central directory
  (only a local extra-field length that moves the data is refused); deflated storages and data.pkl;
  zip64 extras, comments, trailing bytes, directory entries; `byteorder` = big. With two `data.pkl`
  entries Python's zipfile reads the last; torch 2.13 read the clean one in both orders here.
- What it refuses: absolute names (`/tmp/archive/data.pkl`: the prefix becomes empty and `version` is
  missing), `../../archive/...`, backslashes, no folder at all, mixed prefixes, bzip2/lzma members,
  the encrypted flag bit (\"unsupported encryption\"), a compression method that lies, any bytes before
  `PK\\x03\\x04` (read as legacy), `version` 99, the tar format under weights_only=True, TorchScript under
  weights_only=True, and, under weights_only=True, any protocol-4 pickle (`FRAME`, \"Unsupported operand
  149\") — `torch.save(..., pickle_protocol=4)` files do not load with the default torch.load.
- safetensors 0.8 accepts duplicate tensor keys (last wins) but refuses a duplicated `__metadata__`;
  accepts leading spaces before the JSON, NUL in keys and unknown fields in an entry; refuses a BOM,
  NaN literals, lone surrogates, float or negative offsets, gaps, overlaps and trailing bytes.
- Payloads that run and then make torch.load fail (`payload_then_*`, `torch_dynamo_config_load_config`,
  `torch_config_module_load_config`, `tar_payload_storages`) are judged by rule (c) only.
"""


def _cell(text: str, n: int = 240) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= n else text[: n - 1] + "…"
    return text.replace("|", "\\|")


def _short_error(msg: str) -> str:
    """torch's weights_only message is long: keep the part that says what it met."""
    for key in ("WeightsUnpickler error:", "Unsupported global:", "Trying to load unsupported"):
        if key in msg:
            return key + msg.split(key, 1)[1].split("Check the documentation")[0]
    return msg


def reference_text(case: Case, ref: dict[str, Any]) -> str:
    if case.kind == "special":
        return "never opened: torch.load and safe_open block on it (refused by construction)"
    sets = ref.get("files", {}) if case.kind == "folder" else {"": ref.get("steps", {})}
    if case.kind == "folder" and not sets:
        return "folder holds no regular file (nothing to load)"
    parts = []
    for rel, steps in sets.items():
        bits = []
        for key, label in STEPS:
            s = steps.get(key)
            if s is None:
                continue
            if key == "at_exit":
                if s.get("ran"):
                    bits.append(f"{label}: RUN the payload")
                continue
            if s.get("ok"):
                bits.append(f"{label}: loads" + (" and RUNS the payload" if s.get("ran") else ""))
            elif not s.get("ran") and (key == "pickle" or (key == "safetensors"
                                                            and not case.path.endswith(".safetensors"))):
                continue  # a refusal by the loader of another format says nothing here
            else:
                err = _short_error(s.get("error", ""))
                bits.append(f"{label}: {'RUNS the payload, then ' if s.get('ran') else ''}"
                            f"{s.get('type', 'refuses')}: {_cell(err, 140)}")
        parts.append((f"{rel}: " if rel else "") + "; ".join(bits))
    if ref.get("timed_out"):
        parts.append("(timed out)")
    return " / ".join(parts)


def ckpt_text(ck: dict[str, Any]) -> str:
    out = []
    ins = ck["inspect"]
    msg = ins["err"].strip().splitlines()[-1] if ins["err"].strip() else ""
    warn = ""
    if ins["code"] == 0 and isinstance(ins.get("json"), dict):
        warns = ins["json"].get("warnings") or []
        warn = f" warnings: {_cell('; '.join(map(str, warns)), 160)}" if warns else " (no warning)"
    out.append(f"inspect {ins['code']}" + (f": {_cell(msg, 180)}" if msg else "") + warn)
    scan = ck["scan"]
    entry = scan.get("entry") or {}
    dang = sorted({f"{g['module']}.{g['name']}" for g in entry.get("globals", []) if g.get("severity") == "dangerous"})
    serr = "; ".join(entry.get("errors", [])) if entry else scan.get("err", "").strip()
    out.append(f"scan {scan['code']}" + (f" ({entry.get('verdict')})" if entry else "")
               + (f" naming {', '.join(dang)}" if dang else "") + (f": {_cell(serr, 160)}" if serr else ""))
    gate = ck["gate"]
    gentry = gate.get("entry") or {}
    failed = [c["name"] for c in gentry.get("checks", []) if not c.get("passed")]
    out.append(f"gate {gate['code']}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return "<br>".join(out)


def _other_failures(cases: list[Case], dump: dict[str, Any]) -> list[str]:
    """The other checks of test_parity.py, recomputed from the dump."""
    from tests.pickles.test_parity import _scan_names, _torch_name

    out = []
    created = dump["ckpt"]["markers_created_by_ckpt"]
    verdict = "FAILS, markers " + ", ".join(created) if created else "passes"
    out.append(f"- `test_ckpt_never_runs_a_payload`: {verdict}.")
    hidden = [c for c in cases if c.flag]
    bad = [c.name for c in hidden if not (dump["ckpt"]["cases"][c.name]["scan"]["code"] == 1
                                          and _scan_names(dump["ckpt"]["cases"][c.name]["scan"]) & set(c.flag))]
    out.append(f"- `test_hidden_calls_are_named` (a call no stock loader runs, e.g. in a member torch never reads, "
               f"must still be named by scan, exit 1): {len(bad)} of {len(hidden)} fail: "
               + (", ".join(f"`{n}`" for n in bad) or "none") + ".")
    adv = [c for c in cases if c.advisory]
    bad = []
    for c in adv:
        ck = dump["ckpt"]["cases"][c.name]
        text = json.dumps(ck["scan"]["entry"] or ck["scan"]["json"]) + ck["inspect"]["out"] + ck["inspect"]["err"]
        if c.advisory not in text:
            bad.append(f"`{c.name}` ({c.advisory})")
    out.append(f"- `test_advisory_is_named`: {len(bad)} of {len(adv)} fail: " + (", ".join(bad) or "none") + ".")
    wo_bad, wo_missing, wo_n = [], 0, 0
    for c in cases:
        wo = dump["reference"][c.name].get("steps", {}).get("wo_true")
        ins = dump["ckpt"]["cases"][c.name]["inspect"]
        if c.kind != "file" or wo is None or ins["code"] != 0:
            continue
        wo_n += 1
        pred = (ins.get("json") or {}).get("weights_only")
        if not isinstance(pred, dict):
            wo_missing += 1
            continue
        first = [_torch_name(n) for n in wo.get("needs_first", [])]
        needs = {_torch_name(n) for n in pred.get("needs", [])}
        if pred.get("loads") != wo["ok"] or (first and not set(first) & needs):
            wo_bad.append(f"`{c.name}`")
    out.append(f"- `test_weights_only_prediction` (issue 15; cases where inspect exits 0): {wo_missing + len(wo_bad)} "
               f"of {wo_n} fail: {wo_missing} because `inspect --json` has no `weights_only` object yet"
               + (f", and {', '.join(wo_bad)}" if wo_bad else "") + ".")
    return out


def render(dump: dict[str, Any]) -> str:
    cases = [Case(**{**c, "calls": tuple(c["calls"]), "flag": tuple(c["flag"]), "extra": {}}) for c in dump["cases"]]
    per_class = collections.Counter(c.cls for c in cases)
    rows, failing_by_class = [], collections.Counter()
    for c in cases:
        ref, ck = dump["reference"][c.name], dump["ckpt"]["cases"][c.name]
        problems = parity_problems(c, ref, ck)
        if not problems:
            continue
        failing_by_class[c.cls] += 1
        rules = sorted({p[:3] for p in problems})
        rows.append(f"| `{c.name}` | {c.cls} | {_cell(c.note, 120)} | {reference_text(c, ref)} | {ckpt_text(ck)} "
                    f"| {' '.join(rules)} |")
    lines = [
        "# Loader-parity disagreements (issue 13)",
        "",
        "Generated by `tests/hostile/report.py` from a run of `tests/pickles/test_parity.py` against the current",
        "code: every case below fails `test_parity`. Rules: (a) a file a reference loader reads cleanly must",
        "be readable by `ckpt inspect`; (b) a file every reference loader refuses (no payload having run)",
        "must make inspect exit 2, fail the gate, and not be \"safe\" to scan; (c) a file whose payload ran",
        "must make scan exit 1 naming the call, fail the gate, and inspect must name it; (d) scan of a",
        "folder holding nothing readable exits 2; (e) a benign feature (issue 21) is not flagged: scan not",
        "dangerous, gate's loads_safely passes, inspect exits 0 without a dangerous warning. Reference =",
        "torch 2.13 `torch.load(weights_only=True)`, `torch.load(weights_only=False)` (payloads create",
        "marker files), safetensors 0.8 `safe_open` + `get_tensor` of every key, `pickle.load` of files",
        "that are exactly one pickle, and where the file selects them np.load(allow_pickle=True),",
        "torch.jit.load, torch.package, DCP's reader, the shards an index names, and exit hooks. A",
        "safe_open or pickle.load refusal is omitted where another loader reads the file.",
        "",
        f"Cases: {len(cases)}; failing parity: {len(rows)}. Other checks in the same file",
        "(`test_hidden_calls_are_named`, `test_advisory_is_named`, `test_weights_only_prediction`,",
        "`test_ckpt_never_runs_a_payload`) are listed after the table.",
        "",
        NOTES,
        "| class | cases | failing |",
        "| --- | --- | --- |",
        *[f"| {k} | {per_class[k]} | {failing_by_class[k]} |" for k in sorted(per_class)],
        "",
        "| case | class | what it is | torch / safetensors did | ckpt did (exit codes) | rules |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "## The other checks",
        "",
        *_other_failures(cases, dump),
        "",
    ]
    corpus = os.path.dirname(cases[0].path) + "/"
    return "\n".join(lines).replace(corpus, "<corpus>/")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        sys.stdout.write(render(json.load(f)))
