"""``ckpt gate``: the pre-deploy checks a CI job runs on a checkpoint, each reported pass/fail.

Every check runs on every file (a failure does not hide the others), so one
CI run shows everything that is wrong. Only the NaN/Inf check reads tensor
data, one tensor at a time; everything else works on metadata.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CkptError, UsageError
from ...exit_codes import outcome_code
from ...io.remote.counts import counts_remote, with_remote
from ...limits import DEFAULT_LIMITS, Limits
from ...progress import NO_PROGRESS, Progress
from .checks import (
    Check,
    check_dtype_policy,
    check_file_size,
    check_matches_target,
    check_no_nan_inf,
    check_required_metadata,
    check_sha256,
    check_warnings,
    check_weights_only,
    loads_safely,
)
from .names import CheckName
from .policy import Policy


@dataclass(frozen=True)
class FileGate:
    path: str
    checks: tuple[Check, ...]
    error: str | None = None  # the file (or part of it) could not be read: checks that needed it did not run
    dangerous: bool = False  # loads_safely found a call: the gate fails (exit 1) even when it is also unreadable

    @property
    def passed(self) -> bool:
        return self.error is None and not self.dangerous and all(c.passed for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "passed": self.passed, "error": self.error, "dangerous": self.dangerous,
                "checks": [c.to_json() for c in self.checks]}


@dataclass(frozen=True)
class GateReport:
    files: tuple[FileGate, ...]
    policy: Policy = field(default_factory=Policy)
    remote: dict[str, int] | None = None  # requests and bytes, when a path was a URL

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.files)

    @property
    def exit_code(self) -> int:
        """1 a file is dangerous (even if also unreadable), else 2 a file could not be read, else 0 or 1."""
        return outcome_code(dangerous=any(f.dangerous for f in self.files),
                            unreadable=any(f.error for f in self.files), failed=not self.passed)

    def to_json(self) -> dict[str, Any]:
        return with_remote({"passed": self.passed, "files": [f.to_json() for f in self.files],
                            "policy": self.policy.to_json()}, self.remote)


@counts_remote("paths")
def gate(
    paths: Sequence[str | os.PathLike[str]],
    *,
    target: str | None = None,
    target_kwargs: Mapping[str, Any] | None = None,
    policy: Policy | None = None,
    key: str | None = None,
    strict: bool | None = None,
    nan_check: bool | None = None,
    allowed_float_dtypes: Sequence[str] | None = None,
    max_file_size: int | str | None = None,
    required_metadata: Sequence[str] | None = None,
    sha256: str | None = None,
    weights_only_check: bool | None = None,
    allow_globals: Sequence[str] | None = None,
    torch_version: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    progress: Progress = NO_PROGRESS,
) -> GateReport:
    """Check each path against the policy; arguments that are not None override it.

    ``progress`` sees the tensors the NaN/Inf check reads, one step per file.
    """
    if not paths:
        raise UsageError("give at least one checkpoint to gate")
    pol = (policy or Policy()).with_overrides(
        target=target, target_kwargs=dict(target_kwargs) if target_kwargs is not None else None, key=key,
        strict=strict, nan_check=nan_check,
        allowed_float_dtypes=tuple(allowed_float_dtypes) if allowed_float_dtypes else None,
        max_file_size=max_file_size, required_metadata=tuple(required_metadata) if required_metadata else None,
        sha256=sha256, weights_only_check=weights_only_check,
        weights_only_allow=tuple(dict.fromkeys((policy or Policy()).weights_only_allow + tuple(allow_globals)))
        if allow_globals else None,
        weights_only_torch=torch_version,
    )
    if pol.sha256 is not None and len(paths) > 1:
        raise UsageError("a single sha256 pin needs a single PATH; pin several files in the policy's [sha256] table")
    built = None
    if pol.target is not None:
        from ...tensors.target import build_target

        built = build_target(pol.target, dict(pol.target_kwargs or {}))
    files = [_gate_one(os.fspath(p), pol, built, limits, progress) for p in paths]
    return GateReport(tuple(files), pol)


def _gate_one(path: str, pol: Policy, built: Any, limits: Limits, progress: Progress) -> FileGate:
    safety = loads_safely(path, pol, limits)
    checks = [safety.check]
    danger = safety.dangerous
    try:
        from ...formats import load

        ckpt = load(path, key=pol.key, limits=limits)
    except CkptError as exc:
        checks.append(Check(CheckName.READABLE, False, exc.message))
        return FileGate(path, tuple(checks), exc.message, danger)
    try:
        checks.append(check_weights_only(ckpt, pol))
        checks.append(check_matches_target(path, ckpt, pol, built))
        checks.append(check_no_nan_inf(path, ckpt, pol, progress))
        checks.append(check_dtype_policy(ckpt, pol))
        checks.append(check_file_size(path, pol))
        checks.append(check_required_metadata(ckpt, pol))
        checks.append(check_sha256(path, pol))
        checks.append(check_warnings(ckpt, pol))
    except CkptError as exc:  # data unreadable mid-way (truncated storage): the file is corrupt
        checks.append(Check(CheckName.READABLE, False, exc.message))
        return FileGate(path, tuple(checks), exc.message, danger)
    finally:
        ckpt.close()
    return FileGate(path, tuple(checks), safety.unread, danger)


__all__ = ["Check", "CheckName", "FileGate", "GateReport", "Policy", "gate"]
