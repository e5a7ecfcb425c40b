"""One exception tree for the core.

Every error a user can cause carries the message the CLI prints and the exit
code it maps to, so the CLI translates errors in exactly one place.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_ERROR = 2


class CkptError(Exception):
    """Base class: a problem with the user's input or environment, never a bug."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)

    @property
    def message(self) -> str:
        text = str(self.args[0]) if self.args else self.__class__.__name__
        if self.path and not text.startswith(self.path):
            return f"{self.path}: {text}"
        return text


class InputError(CkptError):
    """The input file is missing, unreadable, truncated or corrupt."""


class UnsupportedFormat(InputError):
    """The bytes are not a checkpoint format ckpt knows."""


class LimitExceeded(InputError):
    """A length field or count is beyond a configured limit (see docs/reliability.md)."""


class UnsafeContentError(CkptError):
    """The file needs code execution that the user did not allow."""


class UsageError(CkptError):
    """Bad options or arguments (a rules file, a target spec, a JSON value)."""


class TargetError(CkptError):
    """The target module could not be imported or built."""


class RuleConflict(CkptError):
    """Key-rewriting rules would lose or merge data; nothing was written."""


class OutputExists(CkptError):
    """The output exists and --force was not given."""


class WriteError(CkptError):
    """Writing the output failed (disk full, read-only folder, ...); nothing was left behind."""


class NotEnoughSpace(WriteError):
    """The output would not fit in the free space of its file system; found before anything was read or written."""

