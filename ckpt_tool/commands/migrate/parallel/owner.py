"""The multi-process side of a migrate write: share out the units, write and gather, prove each share.

The owner (the migrate process, or rank 0 under torchrun) creates the
temporary output and its header, writes its own share while the worker
processes (workers.py) or the other ranks write theirs, gathers what their
casts did, and writes the index. The temporary output then goes through the
one publish path (publish.py) like any other: cast check, fsync, verify,
rename; between the fsync and the verification each process compares its
own share bit for bit with the source, and the one verifier is handed
those proofs.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ....errors import CkptError, UsageError, WriteError
from ....io.atomic import renames, write as atomic
from ....writers import SafetensorsPayload, Unit, Written, assign, writer
from ....writers.safetensors import oversized
from ..publish import Proofs, Publish, judge_casts
from ..verify import apply_losses, share_losses
from . import workers as pool
from .workers import Spec, Workers, fingerprint, plan_units, prove_share

if TYPE_CHECKING:
    from ..job import Outcome, WriteJob

_Temporary = atomic.AtomicFile | atomic.AtomicDir


def write_parallel(job: WriteJob) -> Outcome:
    """Write ``job``'s output from several processes (or this torchrun rank's share), then publish it."""
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
    outcome: Outcome | None
    if dist is not None and not dist.leader:
        _follow(job, replace(spec, path=dist.broadcast("")), units, mine)
        outcome = dist.broadcast(None)
    else:
        tmp: _Temporary = atomic.AtomicDir(job.out) if writer(job.format).folder else atomic.AtomicFile(job.out)
        with tmp:
            if isinstance(tmp, atomic.AtomicFile) and tmp.fd is not None:
                os.pwrite(tmp.fd, header, 0)
                os.ftruncate(tmp.fd, len(header) + sum(t.nbytes for t in payload.stored))
            path = dist.broadcast(tmp.path) if dist is not None else tmp.path
            outcome = _own(job, replace(spec, path=path), units, mine, tmp)
            if dist is not None:
                outcome = dist.broadcast(outcome)
    if outcome is None:
        raise CkptError("rank 0 sent no outcome of the write")
    return outcome


def _own(job: WriteJob, spec: Spec, units: list[Unit], mine: list[int], tmp: _Temporary) -> Outcome:
    """The owner's part: its share and the index, then the publish path with every process's proofs."""
    dist = job.plan.parallelism.dist
    workers = Workers(spec) if dist is None and spec.count > 1 else None
    try:
        _write_shares(job, spec, units, mine, workers)
        shards = tuple(u.name for u in units if u.shard is not None)
        late = _write_index(tmp, units, job.plan.output.shard_bytes or 1) if isinstance(tmp, atomic.AtomicDir) else ()
        steps = Publish(job, tmp, Written(shards, late), judge_casts(job))
        if steps.casts.refused:  # values lost to a cast: nothing is verified or published
            job.hooks.progress.done()
            return steps.refused()
        steps.sync()
        if dist is not None:
            dist.barrier()
        return steps.verify_and_rename(_prove_shares(job, spec, units, mine, workers))
    finally:
        if workers is not None:
            workers.close()


def _follow(job: WriteJob, spec: Spec, units: list[Unit], mine: list[int]) -> None:
    """A torchrun rank other than 0: its share written and proven; rank 0 publishes."""
    dist = job.plan.parallelism.dist
    _write_shares(job, spec, units, mine, None)
    job.hooks.progress.done()
    if dist is not None and not judge_casts(job).refused:  # every rank judges the same gathered counts
        dist.barrier()
        _prove_shares(job, spec, units, mine, None)


def _write_shares(job: WriteJob, spec: Spec, units: list[Unit], mine: list[int], workers: Workers | None) -> None:
    """Every process writes its share; the ranks' errors and every process's cast counts are gathered."""
    p, dist = job.hooks.progress, job.plan.parallelism.dist
    p.start("writing", sum(u.nbytes for u in units))
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
    losses = share_losses([t for i in mine for t in units[i].tensors]) + (workers.losses if workers else [])
    if dist is not None:
        losses = [x for part in dist.gather(losses) for x in part]
    apply_losses(job.tensors, dict(losses))


def _prove_shares(job: WriteJob, spec: Spec, units: list[Unit], mine: list[int], workers: Workers | None) -> Proofs:
    """Each process re-reads its share and compares it bit for bit with the source; every process's findings."""
    if not job.verify:
        return Proofs({})
    p, dist = job.hooks.progress, job.plan.parallelism.dist
    p.start("verifying", sum(units[i].nbytes for i in mine))
    if workers is not None:
        workers.tell("verify")
    failures, proven = prove_share(spec.path, units, mine, spec.source.limits)
    if workers is not None:
        for more, spans in workers.verified():
            failures += more
            proven.update(spans)
    if dist is not None:
        found = dist.gather((failures, proven))
        failures = [f for problems, _ in found for f in problems]
        proven = {k: v for _, spans in found for k, v in spans.items()}
    p.done()
    return Proofs(proven, tuple(failures))


def _write_index(tmp: atomic.AtomicDir, units: Sequence[Unit], limit: int) -> tuple[str, ...]:
    """The index of a sharded output, fsynced with its folder; the warning about tensors over the limit."""
    from ....writers import write_all
    from ....writers.safetensors import INDEX_NAME, index_bytes

    fd = tmp.create(INDEX_NAME)
    try:
        write_all(fd, index_bytes([u.shard for u in units if u.shard is not None]))
        os.fsync(fd)
    finally:
        os.close(fd)
    renames.fsync_dir(tmp.path)
    return oversized((t for u in units for t in u.tensors), limit)
