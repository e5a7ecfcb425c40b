"""What ``ckpt migrate`` planned, wrote and proved: the report its renderers and --json read."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...format_names import OutputFormat
from ...io.atomic import staletemp
from ...io.remote import with_remote
from ...keys import Plan, RuleSet
from ...writers import OutTensor
from .verify import CastReport


@dataclass(frozen=True)
class TargetCheck:
    """How the planned output's keys compare with the target's, before anything is written."""

    spec: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    shape_mismatch: tuple[tuple[str, list[int], list[int]], ...]
    allowed_missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatch)


@dataclass(frozen=True)
class MigrateReport:
    """What migrate planned, wrote and proved."""

    source: str
    output: str | None
    format: OutputFormat
    source_format: str
    plan: Plan
    tensors: tuple[OutTensor, ...]
    rules: RuleSet
    inferred: RuleSet | None = None
    dry_run: bool = False
    written: bool = False
    verified: dict[str, bool] = field(default_factory=dict)
    device_status: dict[str, str] = field(default_factory=dict)
    failures: tuple[str, ...] = ()
    target: TargetCheck | None = None
    metadata_kept: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    shards: tuple[str, ...] = ()
    bytes_written: int = 0
    warnings: tuple[str, ...] = ()
    cleaned: tuple[staletemp.Temporary, ...] = ()  # stale temporaries of killed runs removed before writing
    sanitized: tuple[str, ...] | None = None  # --sanitize: "where: what -> what" for each conversion
    weights_only_load: str | None = None  # --sanitize: "passed", "failed: ..." or "not checked: ..."
    remote: dict[str, int] | None = None  # requests and bytes fetched, when SRC is a URL
    cast_loss: tuple[CastReport, ...] = ()  # per cast tensor: values turned inf/NaN, flushed to zero, subnormal
    overflow_allowed: bool = False  # --allow-overflow: new inf/NaN from a cast were accepted
    checks: tuple[str, ...] = ()  # what verification proved, in words (the verified: line)
    copied: tuple[str, ...] = ()  # a Hugging Face folder: the source folder's files copied beside the weights
    left_out: tuple[tuple[str, str], ...] = ()  # ... and those not copied, with why
    source_options: tuple[str, ...] = ()  # how the source was read: --tp-rules FILE, --unstack-layers

    @property
    def ok(self) -> bool:
        """False when verification failed or the target check found differences."""
        return not self.failures and (self.target is None or self.target.ok)

    def to_json(self) -> dict[str, object]:
        return with_remote({
            "source": self.source,
            "output": self.output,
            "format": self.format,
            "source_format": self.source_format,
            "dry_run": self.dry_run,
            "written": self.written,
            "rules": self.rules.cli_args(),
            "inferred_rules": self.inferred.cli_args() if self.inferred is not None else None,
            "renamed": [{"from": a, "to": b} for a, b in self.plan.renamed],
            "dropped": list(self.plan.dropped),
            "cast": [{"key": e.output, "from": e.dtype, "to": e.cast} for e in self.plan.entries
                     if e.cast and e.output],
            "tensors": [{"key": t.key, "source": t.source.key, "dtype": t.dtype, "shape": list(t.shape),
                         "nbytes": t.nbytes} for t in self.tensors],
            "tensor_count": len(self.tensors),
            "total_nbytes": sum(t.nbytes for t in self.tensors),
            "aliases": dict(self.aliases),
            "metadata_kept": list(self.metadata_kept),
            "shards": list(self.shards),
            "bytes_written": self.bytes_written,
            "verified": dict(self.verified),
            "devices": dict(self.device_status),
            "failures": list(self.failures),
            "target": None if self.target is None else {
                "spec": self.target.spec, "ok": self.target.ok, "missing": list(self.target.missing),
                "unexpected": list(self.target.unexpected),
                "shape_mismatch": [{"key": k, "a": a, "b": b} for k, a, b in self.target.shape_mismatch],
                "allowed_missing": list(self.target.allowed_missing),
            },
            "warnings": list(self.warnings),
            "cleaned": [{"path": t.path, "bytes": t.bytes} for t in self.cleaned],
            "cleaned_bytes": sum(t.bytes for t in self.cleaned),
            "sanitized": list(self.sanitized) if self.sanitized is not None else None,
            "weights_only_load": self.weights_only_load,
            "cast_loss": [c.to_json() for c in self.cast_loss],
            "new_nonfinite": sum(c.loss.new_nonfinite for c in self.cast_loss),
            "saturated": sum(c.loss.saturated for c in self.cast_loss),
            "flushed_to_zero": sum(c.loss.flushed for c in self.cast_loss),
            "overflow_allowed": self.overflow_allowed,
            "verified_checks": list(self.checks),
            "copied": list(self.copied),
            "left_out": [{"file": f, "why": why} for f, why in self.left_out],
            "source_options": list(self.source_options),
        }, self.remote)


__all__ = ["MigrateReport", "TargetCheck"]
