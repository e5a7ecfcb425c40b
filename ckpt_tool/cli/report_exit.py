"""The one place the command line turns a report into its exit code (CONTRACT.md: 0, 1, 2).

Errors raised before a report exists map to their code in ``cli.main``
(CkptError.exit_code); a report's findings map here, through the one
precedence rule (ckpt_tool/exit_codes.outcome_code) that gate's and scan's
API reports also apply. Reports are told apart by what they answer, not by
their class, so that ``ckpt scan`` does not import migrate's report to ask.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..exit_codes import ExitCode, outcome_code

__all__ = ["ExitCode", "exit_code"]


@runtime_checkable
class Judged(Protocol):
    """gate, scan: the report knows its code (dangerous, unreadable, failed: outcome_code)."""

    @property
    def exit_code(self) -> int: ...


@runtime_checkable
class Compared(Protocol):
    """diff: equal, or a finding."""

    @property
    def equal(self) -> bool: ...


@runtime_checkable
class Proven(Protocol):
    """migrate: written and verified, or a finding (nothing published)."""

    @property
    def ok(self) -> bool: ...


def exit_code(report: Judged | Compared | Proven) -> ExitCode:
    """0 no finding, 1 a finding (differences, a failed check or verification, dangerous content),
    2 an input that could not be read (gate, scan), unless a dangerous finding outranks it."""
    if isinstance(report, Judged):
        return ExitCode(report.exit_code)
    if isinstance(report, Compared):
        return outcome_code(failed=not report.equal)
    return outcome_code(failed=not report.ok)
