"""The exit codes of the CONTRACT (0 success, 1 a finding, 2 an error) and the one rule that picks one.

A vocabulary module so that the reports that carry an ``exit_code`` for the
API (gate, scan) and the command line (cli/report_exit.py, for every
command) apply the same precedence.
"""
from __future__ import annotations

from enum import IntEnum

from .errors import EXIT_ERROR, EXIT_FINDING, EXIT_OK


class ExitCode(IntEnum):
    OK = EXIT_OK  # success; diff: no differences; gate: passed; scan: all safe
    FINDING = EXIT_FINDING  # differences, gate failed, dangerous content, verification failed
    ERROR = EXIT_ERROR  # bad usage, unreadable, truncated or corrupt input, refused unsafe content


def outcome_code(*, dangerous: bool = False, unreadable: bool = False, failed: bool = False) -> ExitCode:
    """A dangerous finding outranks an unreadable input (a CI job must see the danger), which outranks
    any other finding: an input that was not read whole cannot be said to have passed or failed."""
    if dangerous:
        return ExitCode.FINDING
    if unreadable:
        return ExitCode.ERROR
    return ExitCode.FINDING if failed else ExitCode.OK
