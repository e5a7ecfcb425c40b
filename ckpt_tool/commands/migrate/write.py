"""Writing a planned migration: the bytes by the output format's writer, then the one publish path.

Every decision was made before (commands/migrate/command.py) and travels in a
``WriteJob``; here the bytes are written beside OUT by the writer the
registry names for the output format (writers/registry.py), by this process
or, for the formats several processes can write, by workers or torchrun
ranks (parallel/); then publish.py judges the casts, fsyncs, verifies and
renames the output into place, or leaves nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...format_names import OutputFormat
from ...io.atomic import write as atomic
from ...writers import SafetensorsPayload, Writer, WriteRequest, Written, writer
from .job import WriteJob, single_cast
from .publish import publish, report_of

if TYPE_CHECKING:
    from .report import MigrateReport
    from .verify import EarlyCheck


def write_and_publish(job: WriteJob) -> MigrateReport:
    """The report of ``job``'s output, published only if written and verified (several processes as asked)."""
    if job.workers > 1 or job.plan.parallelism.dist is not None:
        from .parallel import write_parallel

        return report_of(job, write_parallel(job))
    out = writer(job.format)
    request = write_request(job)
    if out.folder:
        with atomic.AtomicDir(job.out) as folder:
            return report_of(job, publish(job, folder, out.write(folder, request)))
    with atomic.AtomicFile(job.out) as file:
        return report_of(job, publish(job, file, _write_file(job, out, file, request)))


def write_request(job: WriteJob) -> WriteRequest:
    """What the format's writer needs of ``job``."""
    hf = job.plan.output.hf
    return WriteRequest(out=job.out, tensors=job.tensors, payload=job.payload, progress=job.hooks.progress,
                        shard_bytes=job.plan.output.shard_bytes, hf=hf,
                        cast_to=single_cast(job) if hf is not None else None)  # only a config file says it


def _write_file(job: WriteJob, out: Writer, file: atomic.AtomicFile, request: WriteRequest) -> Written:
    """A one-file output, followed by an EarlyCheck where one is worth it (its proofs in the result)."""
    from dataclasses import replace

    early = _early_check(job, file.path)
    if early is None:
        return out.write(file, request)
    finished = False
    try:
        written = out.write(file, replace(request, follower=early))
        finished = True
    finally:
        proven = early.close(finished)
    return written._replace(proven=proven)


def _early_check(job: WriteJob, path: str) -> EarlyCheck | None:
    """An EarlyCheck for a verified safetensors file large enough to gain from comparing while it is written."""
    from .verify import EarlyCheck

    payload = job.payload
    if job.format is not OutputFormat.SAFETENSORS or not job.verify or not isinstance(payload, SafetensorsPayload):
        return None
    if job.hooks.after_write is not None:  # a test that changes the file between writing and verifying
        return None
    if not EarlyCheck.worth_it(payload.stored):
        return None
    return EarlyCheck(path, payload.stored, job.plan.source.limits)
