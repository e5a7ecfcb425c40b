"""A planned migration ready to write: the plan, and what planning it against the source decided.

migrate.py builds one ``WriteJob`` after every check that can fail before
writing has passed; write.py (one process) and parallel/ (several) write
it, and publish.py verifies and publishes it. ``report`` is the report of the plan so far (what would be
written, the warnings found); the write step completes it with
``dataclasses.replace``. ``Outcome`` is what a multi-process write decided,
small enough for torch.distributed to broadcast from rank 0.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...format_names import OutputFormat
from ...writers import OutTensor, Payload
from .plan import Hooks, MigratePlan
from .report import MigrateReport
from .verify import CastReport


@dataclass(frozen=True, kw_only=True)
class WriteJob:
    """Everything the write and verify steps need, decided before the first byte is written."""

    plan: MigratePlan  # its rules are the ones applied (inferred ones included)
    hooks: Hooks
    out: str  # the final path (the temporary one is beside it)
    tensors: tuple[OutTensor, ...]
    payload: Payload
    devices: tuple[str, ...]  # where a written output is proven (empty without verification)
    workers: int = 1  # processes writing it (1: this one)
    report: MigrateReport  # the plan's report: what is written, the target check, warnings so far

    @property
    def format(self) -> OutputFormat:
        return self.plan.output.format

    @property
    def verify(self) -> bool:
        return self.plan.verification.enabled


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What writing decided: written or not, proven where, the failures and warnings (picklable)."""

    written: bool = False
    verified: dict[str, bool] = field(default_factory=dict)
    device_status: dict[str, str] = field(default_factory=dict)
    failures: tuple[str, ...] = ()
    shards: tuple[str, ...] = ()
    bytes_written: int = 0
    warnings: tuple[str, ...] = ()
    cast_loss: tuple[CastReport, ...] = ()
    weights_only_load: str | None = None  # --sanitize: torch.load(weights_only=True) of the output, when tried


def device_status(job: WriteJob, verified: Mapping[str, bool], warnings: list[str]) -> dict[str, str]:
    """device -> passed/failed, with the devices that could not be used; one entry without verification."""
    if not job.verify:
        warnings.append("not verified (--no-verify)")
        return {"all": "not verified (--no-verify)"}
    return {**{d: ("passed" if ok else "failed") for d, ok in verified.items()}, **job.report.device_status}


def output_size(path: str) -> int:
    """Bytes of a written file, or of the files of a written folder."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(path) for n in names)


def single_cast(job: WriteJob) -> str | None:
    """The one dtype every cast tensor goes to (a Hugging Face folder's config.json then says it), else None."""
    casts = {e.cast for e in job.report.plan.entries if e.cast and e.output}
    return casts.pop() if len(casts) == 1 else None
