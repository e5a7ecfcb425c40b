"""The one way a migrate output is published: cast check -> fsync -> verify -> rename, or nothing is left.

However the bytes were written (by this process, write.py; by N worker
processes or torchrun ranks, parallel/), the temporary output goes through
the same steps, in this order:

1. ``judge_casts``: values a cast lost (new inf/NaN, clamped) refuse the
   output unless --allow-overflow; nothing is verified or published;
2. ``Publish.sync``: every file and the folder fsynced (in the background
   while the verification reads), then the test hook that changes the file;
3. ``Publish.verify_and_rename``: the one verifier (verify/verify.py) re-reads
   the whole output, handed what was compared before (an EarlyCheck's spans,
   each process's share), then the weights_only load of a sanitized output;
4. the rename into place (io/atomic/write.py), only when every check passed.

The result is an ``Outcome`` (small and picklable: rank 0 broadcasts it),
turned into the report by ``report_of``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ...format_names import OutputFormat
from ...io.atomic import write as atomic
from ...writers import TorchPayload, Written, writer
from .job import Outcome, WriteJob, device_status, output_size, single_cast
from .verify import CastReport, cast_findings

if TYPE_CHECKING:
    from .report import MigrateReport

Temporary = atomic.AtomicFile | atomic.AtomicDir


@dataclass(frozen=True)
class Casts:
    """What the casts did to the values, judged once every byte is written (step 1)."""

    reports: tuple[CastReport, ...]
    warnings: tuple[str, ...]
    refused: tuple[str, ...]  # values lost without --allow-overflow: the output is refused


@dataclass(frozen=True)
class Proofs:
    """What was compared bit for bit before the final verification, and the problems it found."""

    proven: Mapping[str, tuple[int, int]]  # key -> (file offset, bytes)
    failures: tuple[str, ...] = ()


def judge_casts(job: WriteJob) -> Casts:
    """Step 1, in every process that wrote (their counts gathered into ``job.tensors`` first)."""
    reports, warnings, refused = cast_findings(job.tensors, job.plan.verification.allow_overflow)
    return Casts(tuple(reports), tuple(warnings), tuple(refused))


class Publish:
    """Steps 2 to 4 on the temporary output ``tmp``, in the process that owns it."""

    def __init__(self, job: WriteJob, tmp: Temporary, written: Written, casts: Casts) -> None:
        self.job, self.tmp, self.written, self.casts = job, tmp, written, casts
        self.warnings = [*job.report.warnings, *written.warnings, *casts.warnings]

    def refused(self) -> Outcome:
        """Values lost to a cast: nothing is verified or published."""
        return Outcome(verified={"cpu": False}, device_status={"cpu": "failed"}, failures=self.casts.refused,
                       warnings=tuple(self.warnings), cast_loss=self.casts.reports)

    def sync(self) -> None:
        """Step 2: the fsync overlaps the verification's reads; then the tests' hook sees the written output."""
        self.job.hooks.progress.done()
        self.tmp.finish(background=self.job.verify)
        if self.job.hooks.after_write is not None:
            self.job.hooks.after_write(self.tmp.path)

    def verify_and_rename(self, proofs: Proofs) -> Outcome:
        """Steps 3 and 4: verify the whole output, then publish it, or say why not."""
        job, warnings = self.job, self.warnings
        verified, failures = {"cpu": False}, list(proofs.failures)
        if not job.verify:
            verified = {}
        elif not failures:
            verified, failures = _verify(job, self.tmp.path, warnings, proofs.proven)
        loaded = None
        if job.report.sanitized is not None and job.verify and not failures:
            from .verify import load_weights_only

            loaded, problem = load_weights_only(self.tmp.path)
            if problem is not None:
                failures.append(problem)
            elif loaded != "passed":
                warnings.append(f"torch.load(weights_only=True) of the output {loaded}")
        status = device_status(job, verified, warnings)
        done = Outcome(verified=verified, device_status=status, shards=self.written.shards, warnings=tuple(warnings),
                       cast_loss=self.casts.reports, weights_only_load=loaded)
        if failures:
            return replace(done, failures=tuple(failures))
        size = output_size(self.tmp.path)
        self.tmp.publish(replace=job.plan.output.force)
        return replace(done, written=True, bytes_written=size)


def publish(job: WriteJob, tmp: Temporary, written: Written) -> Outcome:
    """Every step, for an output this one process wrote (``written.proven``: what an EarlyCheck compared)."""
    casts = judge_casts(job)
    steps = Publish(job, tmp, written, casts)
    if casts.refused:
        job.hooks.progress.done()
        return steps.refused()
    steps.sync()
    return steps.verify_and_rename(Proofs(written.proven))


def report_of(job: WriteJob, outcome: Outcome) -> MigrateReport:
    """The plan's report completed with what writing decided (and, verified, what it proved in words)."""
    report = replace(job.report, cast_loss=outcome.cast_loss, overflow_allowed=job.plan.verification.allow_overflow,
                     written=outcome.written, verified=outcome.verified, device_status=outcome.device_status,
                     failures=outcome.failures, shards=outcome.shards, bytes_written=outcome.bytes_written,
                     warnings=outcome.warnings)
    if outcome.weights_only_load is not None:
        report = replace(report, weights_only_load=outcome.weights_only_load)
    return replace(report, checks=checks_done(report)) if job.verify and report.written else report


def checks_done(report: MigrateReport) -> tuple[str, ...]:
    """What a passed verification proved, in words, for the ``verified:`` line (the target load is added there)."""
    from ... import dtypes

    plan = report.plan
    dropped = len(plan.dropped)
    out = [f"all {len(plan.entries) - dropped} kept source tensors present"
           + (f", {dropped} dropped by your rules" if dropped else "")]
    out.append("every tensor re-read and compared bit for bit")
    if report.format is OutputFormat.HF_FOLDER:
        out.append(f"{len(report.copied)} copied file(s) equal to the source's" if report.copied
                   else "no file copied beside the weights")
    quantized = sum(1 for t in report.tensors if dtypes.lookup(t.dtype).is_quantized)
    if quantized:
        out.append(f"{quantized} quantized tensor(s) with their scales and zero points")
    subclasses = [t.source.subclass.qualname for t in report.tensors if t.source.subclass is not None]
    if subclasses:
        out.append(f"{len(subclasses)} tensor subclass(es) ({', '.join(sorted(set(subclasses))[:3])}) written back "
                   "as pickled, their inner tensors compared")
    losses = report.cast_loss
    if losses:
        bad = sum(c.loss.overflowed for c in losses)
        flushed = sum(c.loss.flushed for c in losses)
        out.append(f"{len(losses)} cast(s) counted: {bad} value(s) became inf/NaN or were clamped"
                   + (" (--allow-overflow)" if bad else "") + f", {flushed} flushed to zero")
    return tuple(out)


def _verify(job: WriteJob, path: str, warnings: list[str],
            proven: Mapping[str, tuple[int, int]]) -> tuple[dict[str, bool], list[str]]:
    """(device -> passed, first problems) for the temporary output at ``path``, by the one verifier."""
    from .verify import DeviceChecks, Expected, verify_output

    v = job.plan.verification
    others = [d for d in job.devices if d != "cpu"]
    if others and any(t.source.quantizer is not None for t in job.tensors):
        warnings.append(f"quantized tensors have CPU kernels only: on {', '.join(others)} they were not "
                        "round-tripped" + (" and the target was loaded on the CPU only" if v.target else ""))
    payload, hf, folder = job.payload, job.plan.output.hf, path
    fmt = job.plan.output.weights_format
    if hf is not None:  # the weights are re-read as the safetensors file (or set) they are; the folder after
        from .verify import weights_path

        path = weights_path(path, hf, fmt is OutputFormat.SHARDED)
    torch = payload if isinstance(payload, TorchPayload) else None
    expected = Expected(reread=writer(fmt).reread, tensors=job.tensors, plan=job.report.plan, proven=proven,
                        pickled_root=torch.root if torch is not None else None,
                        sd_key=torch.sd_key if torch is not None else "")
    checks = DeviceChecks(devices=job.devices, target=v.target, target_kwargs=v.target_kwargs,
                          allow_missing=v.allow_missing)
    verified, problems = verify_output(path, expected, checks, limits=job.plan.source.limits,
                                       progress=job.hooks.progress)
    if hf is not None and not problems:
        from .verify import check_folder

        problems = check_folder(folder, hf, fmt is OutputFormat.SHARDED, single_cast(job))
        if problems:
            verified = {d: False for d in verified} or {"cpu": False}
    return verified, problems
