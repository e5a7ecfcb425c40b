"""The one check of the CONTRACT's error shape: a bad input is exit 2 and one line on stderr, never a traceback."""
from __future__ import annotations

import re
from typing import Protocol

# ckpt's last resort for an exception it did not expect ("unexpected KeyError: ... this is a bug in ckpt")
INTERNAL_ERROR = re.compile(r"unexpected \w+(Error|Exception|Warning|Exit|Interrupt)\b")


class Ran(Protocol):
    """A finished run of ckpt: in-process (CliRunner, main()) or a subprocess."""

    @property
    def code(self) -> int | str: ...

    @property
    def err(self) -> str: ...


def assert_one_line_error(r: Ran, *needles: str) -> str:
    """Exit 2, exactly one non-blank line ``ckpt: error: ...`` on stderr holding every needle, no traceback.

    Returns the line, for checks of its wording."""
    assert r.code == 2, r
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ckpt: error: "), r.err
    assert "Traceback" not in r.err and not INTERNAL_ERROR.search(r.err), r.err
    for needle in needles:
        assert needle in lines[0], (needle, r.err)
    return lines[0]
