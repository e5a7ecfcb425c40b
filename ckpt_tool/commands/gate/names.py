"""The names of ``ckpt gate``'s checks, declared once: JSON, JUnit, SARIF and the text show them as written here.

One style, the CLI's: lower case words joined by hyphens (``loads-safely``,
``matches-target``), like the options that configure them (``--no-nan-check``)
and SARIF rule ids. The names of earlier releases (``loads_safely``,
``no_nan_inf``) are still accepted wherever a user writes a check name
(``--skip``, the policy's ``skip``): ``CheckName.parse`` reads both.
"""
from __future__ import annotations

from ...errors import UsageError
from ...format_names import Name


class CheckName(Name):
    """One gate check; a ``str`` Enum, so ``check.name == "sha256"`` and JSON keep the plain name."""

    LOADS_SAFELY = "loads-safely"
    READABLE = "readable"  # added when the file (or its data) could not be read: the checks after it did not run
    WEIGHTS_ONLY = "weights-only"
    MATCHES_TARGET = "matches-target"
    NO_NAN_INF = "no-nan-inf"
    DTYPE_POLICY = "dtype-policy"
    FILE_SIZE = "file-size"
    REQUIRED_METADATA = "required-metadata"
    SHA256 = "sha256"
    WARNINGS = "warnings"

    @property
    def describe(self) -> str:
        """What the check guards, in one sentence (SARIF rule descriptions)."""
        return _WHAT[self]

    @property
    def former(self) -> str:
        """The name earlier releases wrote (``loads_safely``); ``weights-only`` and single words kept theirs."""
        return "weights-only" if self is CheckName.WEIGHTS_ONLY else self.value.replace("-", "_")

    @classmethod
    def parse(cls, text: str, origin: str = "check name") -> CheckName:
        """A check named as today (``no-nan-inf``) or as before (``no_nan_inf``, ``weights_only``); any case."""
        wanted = text.strip().lower().replace("_", "-")
        for member in cls:
            if member.value == wanted:
                return member
        known = ", ".join(m.value for m in cls if m is not cls.READABLE)
        raise UsageError(f"{origin}: unknown gate check {text!r} (known: {known})")


_WHAT = {
    CheckName.LOADS_SAFELY: "No pickle in the file calls or constructs a global that can run code (static scan; "
                            "--strict: nor names one outside the inert allowlist).",
    CheckName.READABLE: "The file (or folder) can be read whole by the readers every command uses.",
    CheckName.WEIGHTS_ONLY: "The deployment's default torch.load (weights_only=True) loads the file.",
    CheckName.MATCHES_TARGET: "The state_dict loads strictly into the target module (names and shapes; dtypes "
                              "with --require-dtype).",
    CheckName.NO_NAN_INF: "No floating tensor holds NaN or Inf.",
    CheckName.DTYPE_POLICY: "Every (floating) tensor has an allowed dtype.",
    CheckName.FILE_SIZE: "The file or folder is no larger than the limit.",
    CheckName.REQUIRED_METADATA: "The required metadata keys are present.",
    CheckName.SHA256: "The file's sha256 matches its pin.",
    CheckName.WARNINGS: "Nothing inspect warns about (--strict fails on any warning).",
}

# Checks that vouch for the file's safety or readability: never skipped (fail closed).
UNSKIPPABLE = frozenset({CheckName.LOADS_SAFELY, CheckName.READABLE})
