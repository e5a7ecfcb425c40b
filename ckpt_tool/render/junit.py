"""A JUnit XML report of a gate run: one testsuite per checkpoint, one testcase per check.

CI systems (GitHub Actions reporters, GitLab, Jenkins) show failed test cases
with their message, so a failing gate reads like a failing test.
"""
from __future__ import annotations

import io
import os
import re
import xml.etree.ElementTree as ET

from ..commands.gate import CheckName, GateReport
from .common import write_report

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _text(value: str) -> str:
    """XML 1.0 cannot hold control characters (a hostile key name could carry them)."""
    return _CONTROL.sub("?", value)


def to_xml(report: GateReport) -> ET.ElementTree:
    failures = sum(1 for f in report.files for c in f.checks if not c.passed and c.name != CheckName.READABLE)
    errors = sum(1 for f in report.files for c in f.checks if c.name == CheckName.READABLE and not c.passed)
    skipped = sum(1 for f in report.files for c in f.checks if c.skipped)
    tests = sum(len(f.checks) for f in report.files)
    root = ET.Element("testsuites", name="ckpt gate", tests=str(tests), failures=str(failures),
                      errors=str(errors), skipped=str(skipped))
    for f in report.files:
        suite = ET.SubElement(
            root, "testsuite", name=_text(f.path), tests=str(len(f.checks)),
            failures=str(sum(1 for c in f.checks if not c.passed and c.name != CheckName.READABLE)),
            errors=str(sum(1 for c in f.checks if c.name == CheckName.READABLE and not c.passed)),
            skipped=str(sum(1 for c in f.checks if c.skipped)),
        )
        classname = "ckpt.gate." + re.sub(r"[^A-Za-z0-9_]+", "_", os.path.basename(f.path.rstrip("/")) or "path")
        for c in f.checks:
            case = ET.SubElement(suite, "testcase", classname=classname, name=c.name, file=_text(f.path))
            if c.skipped:
                ET.SubElement(case, "skipped", message=_text(c.detail))
            elif not c.passed:
                tag = "error" if c.name == CheckName.READABLE else "failure"
                node = ET.SubElement(case, tag, message=_text(c.detail.splitlines()[0][:1000]), type=f"ckpt.{c.name}")
                node.text = _text(c.detail)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = _text(c.detail)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(report: GateReport, path: str) -> None:
    """Write the report atomically (a temporary name beside ``path``, then a rename)."""
    buf = io.BytesIO()
    to_xml(report).write(buf, encoding="utf-8", xml_declaration=True)
    write_report(buf.getvalue(), path, "JUnit report")
