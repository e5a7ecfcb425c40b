"""One reviewed decision about a global a pickle may name: what it is, whether it is inert, and why.

The catalog is data, not code that grows one case at a time: the candidates are enumerated
from the installed standard library and torch (and, for third-party entries, read from the
library's source at a named version), each decision is made by hand with its reason, and each
inert entry has a test that unpickles it in a sandboxed subprocess and sees no side effect.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# inert: constructing or calling it (then BUILD) only builds a value.
# trampoline: inert itself, but it calls or constructs an argument, which the walk judges as called.
# excluded: reviewed and left out; ``reason`` says what it would do.
Decision = Literal["inert", "trampoline", "excluded"]


@dataclass(frozen=True)
class Entry:
    """A global (module, name) and the reviewed decision about it."""

    module: str
    name: str
    decision: Decision
    reason: str
    # what the review read, e.g. "CPython 3.11", "torch 2.13", "transformers 5.24.0"
    reviewed: str

    @property
    def pair(self) -> tuple[str, str]:
        return self.module, self.name
