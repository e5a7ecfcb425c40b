"""The owner's side of a multi-process migrate write: share out the units, gather, check the whole, publish.

The owner (the migrate process, or rank 0 under torchrun) creates the
temporary output and its header, writes its own share while the worker
processes (workers.py) or the other ranks write theirs, gathers what their
casts did and what their verification found, then writes the index, checks
the whole output and publishes it (or leaves nothing).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from ....errors import CkptError, UsageError, WriteError
from ....format_names import OutputFormat
from ....io.atomic import renames
from ....io.atomic import write as atomic
from ....writers.payload import SafetensorsPayload
from ....writers.shares import Unit, assign
from ..verify.casts import CastReport, apply_losses, cast_findings, share_losses
from . import workers as pool
from .workers import Spec, Workers, fingerprint, plan_units, verify_share

if TYPE_CHECKING:
    from ..job import Outcome, WriteJob
    from ..report import MigrateReport


class _Shares(NamedTuple):
    """What writing and verifying every share found: failures, and the casts' counts and warnings."""

    failures: tuple[str, ...]
    cast_loss: tuple[CastReport, ...]
    cast_warnings: tuple[str, ...]


_Temporary = atomic.AtomicFile | atomic.AtomicDir


def write_parallel(job: WriteJob) -> MigrateReport:
    """Write, verify and publish ``job``'s output from several processes (or this torchrun rank's share)."""
    if not isinstance(job.payload, SafetensorsPayload):
        raise UsageError(f"a {job.format} output is written by one process")
    payload, dist = job.payload, job.plan.parallelism.dist
    count = dist.world if dist is not None else job.workers
    header, units = plan_units(job.format, payload.stored, payload.aliases, payload.meta,
                               job.plan.output.shard_bytes, count)
    spec = Spec(source=job.plan.source, rules=job.plan.rules, fmt=job.format, shard_bytes=job.plan.output.shard_bytes,
                meta=dict(payload.meta), count=count, fingerprint=fingerprint(header, units), verify=job.verify)
    mine = assign(units, count)[dist.rank if dist is not None else 0]
    if dist is not None:
        dist.start()
        if len(set(dist.gather(spec.fingerprint))) > 1:
            raise UsageError("the ranks planned different outputs: give every rank the same command and source")
    if dist is not None and not dist.leader:
        path = dist.broadcast("")
        shares = _run(job, replace(spec, path=path), units, mine, None)
        outcome: Outcome | None = dist.broadcast(None)
    else:
        sharded = job.format is OutputFormat.SHARDED
        tmp: _Temporary = atomic.AtomicDir(job.out) if sharded else atomic.AtomicFile(job.out)
        with tmp:
            if isinstance(tmp, atomic.AtomicFile) and tmp.fd is not None:
                os.pwrite(tmp.fd, header, 0)
                os.ftruncate(tmp.fd, len(header) + sum(t.nbytes for t in payload.stored))
            path = dist.broadcast(tmp.path) if dist is not None else tmp.path
            shares = _run(job, replace(spec, path=path), units, mine, tmp)
            outcome = _finish(job, tmp, units, shares)
            if dist is not None:
                outcome = dist.broadcast(outcome)
    if outcome is None:
        raise CkptError("rank 0 sent no outcome of the write")
    return replace(job.report, cast_loss=shares.cast_loss, overflow_allowed=job.plan.verification.allow_overflow,
                   written=outcome.written, verified=outcome.verified, device_status=outcome.device_status,
                   failures=outcome.failures, shards=outcome.shards, bytes_written=outcome.bytes_written,
                   warnings=outcome.warnings)


def _run(job: WriteJob, spec: Spec, units: list[Unit], mine: list[int], tmp: _Temporary | None) -> _Shares:
    """Write every share and verify it (``tmp``: the temporary output, in its owner only); the failures found."""
    p, dist = job.hooks.progress, job.plan.parallelism.dist
    p.start("writing", sum(u.nbytes for u in units))
    workers = Workers(spec) if dist is None and spec.count > 1 else None
    try:
        error: tuple[type[CkptError], str] | None = None
        try:
            pool.write_share(spec.path, units, mine, p.advance, sync=dist is not None)
        except (CkptError, OSError) as exc:
            if dist is None:
                raise
            # every rank must reach the gather below, or the others would wait for it until the timeout
            error = (type(exc), exc.message) if isinstance(exc, CkptError) else (WriteError, f"cannot write: {exc}")
        if workers is not None:
            workers.written()
            for i in range(1, spec.count):
                p.advance(sum(units[k].nbytes for k in assign(units, spec.count)[i]))
        if dist is not None:
            errors = [e for e in dist.gather(error) if e is not None]
            if errors:
                raise errors[0][0](errors[0][1])
        p.done()
        losses = share_losses([t for i in mine for t in units[i].tensors]) + (workers.losses if workers else [])
        if dist is not None:
            losses = [x for part in dist.gather(losses) for x in part]
        apply_losses(job.tensors, dict(losses))
        reports, warnings, refused = cast_findings(job.tensors, job.plan.verification.allow_overflow)
        cast = (tuple(reports), tuple(warnings))
        if refused:  # values lost to a cast: nothing is verified or published
            return _Shares(tuple(refused), *cast)
        if tmp is not None and dist is None:
            tmp.finish(background=job.verify)  # one fsync of every writer's pages, overlapping the verification
        if (dist is None or dist.leader) and job.hooks.after_write is not None:
            job.hooks.after_write(spec.path)
        if dist is not None:
            dist.barrier()
        failures: list[str] = []
        if job.verify:
            p.start("verifying", sum(units[i].nbytes for i in mine))
            if workers is not None:
                workers.tell("verify")
            failures = verify_share(spec.path, spec.fmt, units, mine, spec.source.limits)
            if workers is not None:
                failures += workers.verified()
            if dist is not None:
                failures = [f for found in dist.gather(failures) for f in found]
            p.done()
        return _Shares(tuple(failures), *cast)
    finally:
        if workers is not None:
            workers.close()


def _finish(job: WriteJob, tmp: _Temporary, units: list[Unit], shares: _Shares) -> Outcome:
    """The owner's part: index, fsync, whole-output checks, publish."""
    from ..job import Outcome, device_status, output_size

    failures = list(shares.failures)
    warnings = [*job.report.warnings, *shares.cast_warnings]
    shards = tuple(u.name for u in units if u.shard is not None)
    if isinstance(tmp, atomic.AtomicDir):
        warnings += _write_index(tmp, units, job.plan.output.shard_bytes or 1)
    if job.plan.parallelism.dist is not None:
        # the ranks fsynced their own writes; this flushes the owner's (publish waits for a background one)
        tmp.finish()
    verified: dict[str, bool] = {}
    if job.verify:
        if not failures:
            from .check import check_whole

            verified, failures = check_whole(job, tmp.path)
        else:
            verified = {"cpu": False}
    status = device_status(job, verified, warnings)
    if failures:
        return Outcome(verified=verified, device_status=status, shards=shards, warnings=tuple(warnings),
                       failures=tuple(failures))
    size = output_size(tmp.path)
    tmp.publish(replace=job.plan.output.force)
    return Outcome(verified=verified, device_status=status, shards=shards, warnings=tuple(warnings),
                   written=True, bytes_written=size)


def _write_index(tmp: atomic.AtomicDir, units: Sequence[Unit], limit: int) -> list[str]:
    """The index of a sharded output, fsynced with its folder; the warning about tensors over the limit."""
    from ....writers.output import write_all
    from ....writers.safetensors.sharded import INDEX_NAME, index_bytes

    fd = tmp.create(INDEX_NAME)
    try:
        write_all(fd, index_bytes([u.shard for u in units if u.shard is not None]))
        os.fsync(fd)
    finally:
        os.close(fd)
    renames.fsync_dir(tmp.path)
    big = [t.key for u in units for t in u.tensors if t.nbytes > limit]
    if big:
        return [f"{len(big)} tensor(s) are larger than --max-shard-size and have a shard of their own: "
                f"{', '.join(big[:3])}"]
    return []
