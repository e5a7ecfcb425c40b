"""The names of ``ckpt gate``'s checks, declared once: JSON, JUnit, SARIF and the text show them as written here."""
from __future__ import annotations

from ...format_names import Name


class CheckName(Name):
    """One gate check; a ``str`` Enum, so ``check.name == "sha256"`` and JSON keep the plain name."""

    LOADS_SAFELY = "loads_safely"
    READABLE = "readable"  # added when the file (or its data) could not be read: the checks after it did not run
    WEIGHTS_ONLY = "weights-only"
    MATCHES_TARGET = "matches_target"
    NO_NAN_INF = "no_nan_inf"
    DTYPE_POLICY = "dtype_policy"
    FILE_SIZE = "file_size"
    REQUIRED_METADATA = "required_metadata"
    SHA256 = "sha256"
    WARNINGS = "warnings"
