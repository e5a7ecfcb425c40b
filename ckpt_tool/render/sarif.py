"""SARIF 2.1.0 reports of scan and gate runs, the format code-scanning services read.

One run per report; one rule per kind of finding (a dangerous global, a
suspicious one, a failed gate check); one result per finding, located at the
checkpoint file (the member or pickle inside it is named in the message,
since SARIF regions address text lines, not archive members).
"""
from __future__ import annotations

import json
from typing import Any

from ..commands.gate import CheckName, GateReport
from ..commands.scan import ScanReport
from ..pickles import severity
from ..version import __version__
from .common import write_report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL: dict[str, str] = {severity.DANGEROUS: "error", severity.SUSPICIOUS: "warning"}
_SCAN_RULES = {
    "dangerous-global": "A pickle calls or constructs a global outside the inert allowlist, or names one that "
                        "runs code: a full unpickle runs it when the file is loaded.",
    "suspicious-global": "A pickle names a global outside the inert allowlist but never calls or constructs it "
                         "(a full unpickle imports its module).",
    "dangerous-opcode": "A pickle does something dangerous besides naming a global (e.g. a known weights_only "
                        "exploit shape).",
    "suspicious-opcode": "A pickle does something unusual that no torch.save writes.",
    "unreadable": "The file could not be read; nothing in it can be vouched for.",
}


def _run(rules: dict[str, str], results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "ckpt", "version": __version__, "informationUri": "https://pypi.org/project/ckpt-tool/",
                "rules": [{"id": rid, "shortDescription": {"text": text}} for rid, text in rules.items()],
            }},
            "results": results,
        }],
    }


def _result(rule: str, level: str, message: str, path: str) -> dict[str, Any]:
    return {
        "ruleId": rule,
        "level": level,
        "message": {"text": message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": path}}}],
    }


def scan_sarif(report: ScanReport) -> dict[str, Any]:
    results = []
    for f in report.files:
        for g in f.globals:
            if g.severity in _LEVEL:
                where = f" in {g.where}" if g.where else ""
                verb = ("runs code" if g.severity == severity.DANGEROUS
                        else "is named, never called (not on the inert allowlist)")
                results.append(_result(f"{g.severity}-global", _LEVEL[g.severity],
                                       f"{g.module}.{g.name}{where} {verb} (NOT executed by ckpt)", f.path))
        for finding in f.findings:
            if finding.severity in _LEVEL:
                where = f" ({finding.where})" if finding.where else ""
                results.append(_result(f"{finding.severity}-opcode", _LEVEL[finding.severity],
                                       finding.message + where, f.path))
        for error in f.errors:
            results.append(_result("unreadable", "error", error, f.path))
    return _run(_SCAN_RULES, results)


def gate_sarif(report: GateReport) -> dict[str, Any]:
    """One rule per check (``gate/loads-safely``); a failed check is an error, one that passed with a
    warning (a dtype the load casts, a warning --strict would fail on) a warning."""
    rules: dict[str, str] = {}
    results = []
    for f in report.files:
        for c in f.checks:
            rules.setdefault(f"gate/{c.name}", f"The gate check '{c.name}': {c.name.describe}")
            if not c.passed and not c.skipped:
                results.append(_result(f"gate/{c.name}", "error", c.detail or c.name, f.path))
            elif c.warning:
                results.append(_result(f"gate/{c.name}", "warning", c.detail, f.path))
        if f.error:
            rules.setdefault("gate/readable", f"The gate check 'readable': {CheckName.READABLE.describe}")
            if not any(c.name == CheckName.READABLE for c in f.checks):
                results.append(_result("gate/readable", "error", f.error, f.path))
    return _run(rules, results)


def write_sarif(document: dict[str, Any], path: str) -> None:
    write_report(json.dumps(document, indent=2).encode(), path, "SARIF report")
