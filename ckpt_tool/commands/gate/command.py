"""``ckpt gate``: the pre-deploy checks a CI job runs on a checkpoint, each reported pass/fail.

Every check runs on every file (a failure does not hide the others), so one
CI run shows everything that is wrong. Only the NaN/Inf check reads tensor
data, one tensor at a time; everything else works on metadata.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import CkptError, UsageError
from ...exit_codes import outcome_code
from ...formats import Keyed, Limited, Predicting, SourceOptions, TpRulesFile
from ...io.remote import counts_remote, with_remote
from ...progress import NO_PROGRESS, Progress
from ..keywords import Counted, options_of, source_of, verb
from .checks import (
    Check,
    check_dtype_policy,
    check_file_size,
    check_matches_target,
    check_no_nan_inf,
    check_required_metadata,
    check_sha256,
    check_warnings,
)
from .loading import check_weights_only, loads_safely
from .names import CheckName
from .policy import Policy

if TYPE_CHECKING:
    from ...tensors.target import TargetSpec


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


@dataclass(frozen=True, kw_only=True)
class GateOptions:
    """gate's own options; those that are not None override the policy's (how the files are read, and the
    policy's ``key`` and ``weights_only_torch``, come from the SourceOptions beside them)."""

    target: TargetSpec | None = None
    target_kwargs: Mapping[str, Any] | None = None
    policy: Policy | None = None
    strict: bool | None = None
    nan_check: bool | None = None
    allowed_float_dtypes: Sequence[str] | None = None
    max_file_size: int | str | None = None
    required_metadata: Sequence[str] | None = None
    sha256: str | None = None
    weights_only_check: bool | None = None
    allow_globals: Sequence[str] | None = None
    require_dtype: bool | None = None
    skip: Sequence[str] | None = None


@dataclass(frozen=True)
class GateCall(GateOptions, Counted, TpRulesFile, Predicting, Limited, Keyed):
    """Check each path against the policy; arguments that are not None override it.

    ``target`` is a SPEC, or from Python an nn.Module class or instance (the policy shows its name).
    ``progress`` sees the tensors the NaN/Inf check reads, one step per file.
    ``require_dtype`` fails a dtype that differs from the target's (by default a warning: the load casts).
    ``skip`` names checks not to run (``sha256``, ``no-nan-inf``; earlier names such as ``no_nan_inf`` too),
    added to the policy's; ``loads-safely`` is never skipped.
    ``tp_rules`` names a TOML file saying how tensor-parallel shards merge (``ckpt migrate --tp-rules``): a
    Megatron-LM ``mp_rank_XX`` folder or a DeepSpeed run without universal_checkpoint_info is then checked as
    the merged model instead of failing ``readable``.
    """

    paths: Sequence[str | os.PathLike[str]]


def _called(call: GateCall) -> GateReport:
    return gate_paths(call.paths, source_of(call), options_of(GateOptions, call), call.progress)


gate = verb("gate", GateCall, _called)  # the Python verb: keyword arguments (commands/keywords.py)


@counts_remote("paths")
def gate_paths(paths: Sequence[str | os.PathLike[str]], source: SourceOptions, options: GateOptions,
               progress: Progress = NO_PROGRESS) -> GateReport:
    """Check each path against the policy, overridden by ``options`` and ``source.key``/``torch_version``."""
    if not paths:
        raise UsageError("give at least one checkpoint to gate")
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one path given bare, not in a list
    held = [type(p).__name__ for p in paths if not isinstance(p, (str, os.PathLike))]
    if held:
        raise UsageError(f"gate checks files and folders (the bytes that are deployed: their pickles, size and pin), "
                         f"not a {held[0]}: save it first, or compare it with ckpt_tool.diff / ckpt_tool.inspect")
    pol = _policy(source, options)
    if pol.sha256 is not None and len(paths) > 1:
        raise UsageError("a single sha256 pin needs a single PATH; pin several files in the policy's [sha256] table")
    built = None
    if pol.target is not None and CheckName.MATCHES_TARGET not in pol.skip:  # skipped: nothing to build
        from ...tensors.target import build_target

        # a Python object (an nn.Module class or instance) is built as given; its label is only its name
        target = options.target
        built = build_target(pol.target if target is None or isinstance(target, str) else target,
                             dict(pol.target_kwargs or {}))
    files = [_gate_one(os.fspath(p), pol, built, source, progress) for p in paths]
    return GateReport(tuple(files), pol)


def _policy(source: SourceOptions, o: GateOptions) -> Policy:
    """The policy file's (or the default) policy, with the options that are not None over it."""
    from ...tensors.target import target_label  # light: building one imports torch, naming one does not

    base = o.policy or Policy()
    return base.with_overrides(
        target=target_label(o.target) if o.target is not None else None,
        target_kwargs=dict(o.target_kwargs) if o.target_kwargs is not None else None, key=source.key,
        strict=o.strict, nan_check=o.nan_check,
        allowed_float_dtypes=tuple(o.allowed_float_dtypes) if o.allowed_float_dtypes else None,
        max_file_size=o.max_file_size, required_metadata=tuple(o.required_metadata) if o.required_metadata else None,
        sha256=o.sha256, weights_only_check=o.weights_only_check,
        weights_only_allow=tuple(dict.fromkeys(base.weights_only_allow + tuple(o.allow_globals)))
        if o.allow_globals else None,
        weights_only_torch=source.torch_version, require_target_dtype=o.require_dtype,
        skip=tuple(base.skip) + tuple(o.skip) if o.skip else None,
    )


def _gate_one(path: str, pol: Policy, built: Any, source: SourceOptions, progress: Progress) -> FileGate:
    limits = source.limits
    safety = loads_safely(path, pol, limits)
    checks = [safety.check]
    danger = safety.dangerous
    try:
        from ...formats import read_checkpoint

        # never unpickled: the gate judges the file as the deployment's safe loader meets it
        ckpt = read_checkpoint(path, SourceOptions(key=pol.key, limits=limits, tp_rules=source.tp_rules))
    except CkptError as exc:
        checks.append(Check(CheckName.READABLE, False, exc.message))
        return FileGate(path, tuple(checks), exc.message, danger)
    runs: list[tuple[CheckName, Callable[[], Check]]] = [
        (CheckName.WEIGHTS_ONLY, lambda: check_weights_only(ckpt, pol)),
        (CheckName.MATCHES_TARGET, lambda: check_matches_target(path, ckpt, pol, built)),
        (CheckName.NO_NAN_INF, lambda: check_no_nan_inf(path, ckpt, pol, progress)),
        (CheckName.DTYPE_POLICY, lambda: check_dtype_policy(ckpt, pol)),
        (CheckName.FILE_SIZE, lambda: check_file_size(path, pol)),
        (CheckName.REQUIRED_METADATA, lambda: check_required_metadata(ckpt, pol)),
        (CheckName.SHA256, lambda: check_sha256(path, pol)),
        (CheckName.WARNINGS, lambda: check_warnings(ckpt, pol)),
    ]
    try:
        for name, run in runs:
            checks.append(Check(name, True, "skipped: --skip (or the policy's skip)", skipped=True)
                          if name in pol.skip else run())
    except CkptError as exc:  # data unreadable mid-way (truncated storage): the file is corrupt
        checks.append(Check(CheckName.READABLE, False, exc.message))
        return FileGate(path, tuple(checks), exc.message, danger)
    finally:
        ckpt.close()
    return FileGate(path, tuple(checks), safety.unread, danger)


__all__ = ["Check", "CheckName", "FileGate", "GateCall", "GateOptions", "GateReport", "Policy", "gate", "gate_paths"]
