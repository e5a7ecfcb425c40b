"""Writing a planned migration: write the temporary output, verify it, and publish it or leave nothing.

Every decision was made before (commands/migrate/command.py) and travels in a
``WriteJob``; here the bytes are written beside OUT by the writer that
``WRITERS`` names for the output format, read back and compared, and renamed
into place only when every check passed.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from ...format_names import OutputFormat
from ...io.atomic import write as atomic
from ...writers.payload import SafetensorsPayload, TorchPayload
from .job import WriteJob, device_status, output_size, single_cast
from .report import MigrateReport

if TYPE_CHECKING:
    from .verify.early import EarlyCheck


_NOTHING_PROVEN: Mapping[str, tuple[int, int]] = {}


class Written(NamedTuple):
    """What a writer reports besides the bytes: the shard files, warnings about them, and the tensors an
    EarlyCheck compared with their sources while the file was written (key -> file offset, bytes)."""

    shards: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    proven: Mapping[str, tuple[int, int]] = _NOTHING_PROVEN


@dataclass(frozen=True)
class FileWriter:
    """A writer of one file: it gets the open temporary file's descriptor."""

    write: Callable[[int, WriteJob], Written]


@dataclass(frozen=True)
class FolderWriter:
    """A writer of a folder: it gets the temporary folder to create its files in."""

    write: Callable[[atomic.AtomicDir, WriteJob], Written]


class PayloadMismatch(RuntimeError):
    """A writer got the payload of another format: a bug in the planner, never the user's doing."""


def _torch(job: WriteJob) -> TorchPayload:
    if not isinstance(job.payload, TorchPayload):
        raise PayloadMismatch(f"a {job.format} output was planned without its pickled container")
    return job.payload


def _safetensors(job: WriteJob) -> SafetensorsPayload:
    if not isinstance(job.payload, SafetensorsPayload):
        raise PayloadMismatch(f"a {job.format} output was planned without its stored tensors")
    return job.payload


def _write_torch_zip(fd: int, job: WriteJob) -> Written:
    from ...writers.torchsave.archive import write_torch_zip

    payload, p = _torch(job), job.hooks.progress
    p.start("writing", sum(s.nbytes for s in payload.table.storages))
    write_torch_zip(fd, job.out, payload.data_pkl, payload.table, p.advance)
    return Written()


def _write_safetensors(fd: int, job: WriteJob, early: EarlyCheck | None = None) -> Written:
    from ...writers.safetensors.single import write_safetensors

    payload, p = _safetensors(job), job.hooks.progress
    p.start("writing", sum(t.nbytes for t in payload.stored))
    if early is None:
        write_safetensors(fd, payload.stored, {**payload.meta, **payload.aliases}, p.advance)
        return Written()
    finished = False
    try:
        write_safetensors(fd, payload.stored, {**payload.meta, **payload.aliases}, p.advance, early)
        finished = True
    finally:
        proven = early.close(finished)
    return Written(proven=proven)


def _write_sharded(tmp: atomic.AtomicDir, job: WriteJob) -> Written:
    from ...writers.safetensors.sharded import write_sharded

    payload, p = _safetensors(job), job.hooks.progress
    limit = job.plan.output.shard_bytes or 1
    p.start("writing", sum(t.nbytes for t in payload.stored))
    shards = write_sharded(tmp.path, tmp.create, payload.stored, payload.aliases, payload.meta, limit, p.advance)
    big = [t.key for t in payload.stored if t.nbytes > limit]
    warnings = (f"{len(big)} tensor(s) are larger than --max-shard-size and have a shard of their own: "
                f"{', '.join(big[:3])}",) if big else ()
    return Written(tuple(shards), warnings)


def _write_dcp(tmp: atomic.AtomicDir, job: WriteJob) -> Written:
    from ...writers.dcp import write_dcp

    p = job.hooks.progress
    p.start("writing", sum(t.nbytes for t in job.tensors))
    write_dcp(tmp.path, job.tensors, p.advance)
    return Written()


def _write_hf_folder(tmp: atomic.AtomicDir, job: WriteJob) -> Written:
    from ...writers.hf_folder import write_hf_folder

    payload, p, hf = _safetensors(job), job.hooks.progress, job.plan.output.hf
    if hf is None:
        raise PayloadMismatch("a Hugging Face folder output was planned without its folder plan")
    cast_to = single_cast(job)
    p.start("writing", sum(t.nbytes for t in payload.stored))
    written = write_hf_folder(tmp.path, tmp.create, payload, hf, job.plan.output.shard_bytes, cast_to, p.advance)
    notes = (f"{written.retyped}: its dtype field rewritten to {cast_to}, the dtype the weights were cast to "
             "(the other copied files are byte for byte the source's)",) if written.retyped else ()
    return Written(written.shards, notes)


WRITERS: Mapping[OutputFormat, FileWriter | FolderWriter] = {
    OutputFormat.TORCH_ZIP: FileWriter(_write_torch_zip),
    OutputFormat.SAFETENSORS: FileWriter(_write_safetensors),
    OutputFormat.SHARDED: FolderWriter(_write_sharded),
    OutputFormat.DCP: FolderWriter(_write_dcp),
    OutputFormat.HF_FOLDER: FolderWriter(_write_hf_folder),
}


def write_and_publish(job: WriteJob) -> MigrateReport:
    """The report of ``job``'s output, published only if written and verified (several processes as asked)."""
    if job.workers > 1 or job.plan.parallelism.dist is not None:
        from .parallel.owner import write_parallel

        report = write_parallel(job)
        return replace(report, checks=checks_done(report)) if job.verify and report.written else report
    writer = WRITERS[job.format]
    if isinstance(writer, FolderWriter):
        with atomic.AtomicDir(job.out) as folder:
            return _prove_and_publish(job, folder, writer.write(folder, job))
    with atomic.AtomicFile(job.out) as file:
        if file.fd is None:  # AtomicFile opens it on entering: a bug, never the user's doing
            raise RuntimeError(f"the temporary file for {job.out} is not open")
        early = _early_check(job, file.path)
        written = writer.write(file.fd, job) if early is None else _write_safetensors(file.fd, job, early)
        return _prove_and_publish(job, file, written)


def _early_check(job: WriteJob, path: str) -> EarlyCheck | None:
    """An EarlyCheck for a verified safetensors file large enough to gain from comparing while it is written."""
    from .verify.early import EarlyCheck

    payload = job.payload
    if job.format is not OutputFormat.SAFETENSORS or not job.verify or not isinstance(payload, SafetensorsPayload):
        return None
    if job.hooks.after_write is not None:  # a test that changes the file between writing and verifying
        return None
    if not EarlyCheck.worth_it(payload.stored):
        return None
    return EarlyCheck(path, payload.stored, job.plan.source.limits)


def _prove_and_publish(job: WriteJob, tmp: atomic.AtomicFile | atomic.AtomicDir, written: Written) -> MigrateReport:
    """Judge the casts, verify the temporary output and publish it, or say why not."""
    from .verify.casts import cast_findings

    job.hooks.progress.done()
    losses, cast_warnings, refused = cast_findings(job.tensors, job.plan.verification.allow_overflow)
    warnings = [*job.report.warnings, *written.warnings, *cast_warnings]
    report = replace(job.report, cast_loss=losses, overflow_allowed=job.plan.verification.allow_overflow,
                     shards=written.shards)
    if refused:  # values lost to a cast: nothing is verified or published
        return replace(report, verified={"cpu": False}, device_status={"cpu": "failed"}, failures=tuple(refused),
                       shards=(), warnings=tuple(warnings))
    tmp.finish(background=job.verify)  # the fsync overlaps the verification's reads
    size = output_size(tmp.path)
    if job.hooks.after_write is not None:
        job.hooks.after_write(tmp.path)
    verified, failures = _verify(job, tmp.path, warnings, written.proven)
    if report.sanitized is not None and job.verify and not failures:
        from .verify.weights_only import load_weights_only

        outcome, problem = load_weights_only(tmp.path)
        report = replace(report, weights_only_load=outcome)
        if problem is not None:
            failures.append(problem)
        elif outcome != "passed":
            warnings.append(f"torch.load(weights_only=True) of the output {outcome}")
    status = device_status(job, verified, warnings)
    if failures:
        return replace(report, verified=verified, device_status=status, failures=tuple(failures),
                       warnings=tuple(warnings))
    tmp.publish(replace=job.plan.output.force)
    report = replace(report, written=True, verified=verified, device_status=status, bytes_written=size,
                     warnings=tuple(warnings))
    return replace(report, checks=checks_done(report)) if job.verify else report


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
    """(device -> passed, first problems) for the temporary output at ``path``."""
    if not job.verify:
        return {}, []
    from .verify.verify import verify_output

    v = job.plan.verification
    others = [d for d in job.devices if d != "cpu"]
    if others and any(t.source.quantizer is not None for t in job.tensors):
        warnings.append(f"quantized tensors have CPU kernels only: on {', '.join(others)} they were not "
                        "round-tripped" + (" and the target was loaded on the CPU only" if v.target else ""))
    payload = job.payload
    fmt, hf, job_folder = job.format, job.plan.output.hf, path
    if hf is not None:  # the weights are re-read as the safetensors file (or set) they are; the folder after
        from .verify.hf import weights_path

        fmt = job.plan.output.weights_format
        path = weights_path(path, hf, fmt is OutputFormat.SHARDED)
    verified, problems = verify_output(path, fmt, job.tensors,
                         pickled_root=payload.root if isinstance(payload, TorchPayload) else None,
                         sd_key=payload.sd_key if isinstance(payload, TorchPayload) else "", devices=job.devices,
                         target=v.target, target_kwargs=v.target_kwargs, allow_missing=v.allow_missing,
                         limits=job.plan.source.limits, progress=job.hooks.progress, plan=job.report.plan,
                         proven=proven)
    if hf is not None and not problems:
        from .verify.hf import check_folder

        problems = check_folder(job_folder, hf, fmt is OutputFormat.SHARDED, single_cast(job))
        if problems:
            verified = {d: False for d in verified} or {"cpu": False}
    return verified, problems
