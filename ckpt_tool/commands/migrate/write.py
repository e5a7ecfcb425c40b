"""Writing a planned migration: write the temporary output, verify it, and publish it or leave nothing.

Every decision was made before (commands/migrate/migrate.py) and travels in a
``Job``; here the bytes are written beside OUT, read back and compared,
and renamed into place only when every check passed.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ... import writers
from ...io.atomic import write as atomic
from ...limits import Limits
from ...writers.base import OutTensor
from .report import MigrateReport


class Progress(Protocol):
    """Where migrate reports bytes done (the CLI draws a bar on a terminal)."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def done(self) -> None: ...


class NoProgress:
    """The API's default: a caller that passes no ``progress`` sees none."""

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def done(self) -> None:
        pass


@dataclass
class Job:
    """Everything the write and verify steps need, decided before the first byte is written."""

    out: str
    fmt: str
    tensors: tuple[OutTensor, ...]
    payload: dict[str, Any]
    shard_bytes: int | None
    devices: list[str]
    status: dict[str, str]
    target: str | None
    target_kwargs: dict[str, Any] | None
    allow_missing: tuple[str, ...]
    verify: bool
    limits: Limits
    progress: Progress
    after_write: Callable[[str], None] | None
    report_args: dict[str, Any]
    warnings: list[str]
    force: bool = False
    workers: int = 1
    dist: Any = None  # consolidate_dist.Dist under torchrun
    source: tuple[str, str | None, bool] = ("", None, False)  # (src, --key, --unsafe): how workers re-read it
    allow_overflow: bool = False  # --allow-overflow: a cast may turn finite values into inf/NaN


def write_and_publish(job: Job) -> MigrateReport:
    """The report of ``job``'s output, published only if written and verified (several processes as asked)."""
    if job.workers > 1 or job.dist is not None:
        from .parallel.workers import Spec, write_parallel

        src, key, unsafe = job.source
        spec = Spec(src, key, unsafe, job.limits, job.report_args["rules"], job.fmt, job.shard_bytes,
                    dict(job.payload["meta"]), count=job.workers)
        result = write_parallel(job, spec, job.dist)  # it adds what the casts did to report_args
        if job.verify and result.get("written"):
            job.report_args["checks"] = checks_done(job)
        return MigrateReport(**job.report_args, **result)
    folder = job.fmt in writers.FOLDER_FORMATS
    shards: list[str] = []
    p = job.progress
    tmp: atomic.AtomicDir | atomic.AtomicFile = atomic.AtomicDir(job.out) if folder else atomic.AtomicFile(job.out)
    with tmp:
        if isinstance(tmp, atomic.AtomicFile) and tmp.fd is not None and job.fmt == writers.TORCH_ZIP:
            from ...writers.torchsave.archive import write_torch_zip

            data_pkl, table = job.payload["pickle"]
            p.start("writing", sum(s.nbytes for s in table.storages))
            write_torch_zip(tmp.fd, job.out, data_pkl, table, p.advance)
        elif isinstance(tmp, atomic.AtomicFile) and tmp.fd is not None and job.fmt == writers.SAFETENSORS:
            from ...writers.safetensors.single import write_safetensors

            p.start("writing", sum(t.nbytes for t in job.payload["stored"]))
            write_safetensors(tmp.fd, job.payload["stored"], {**job.payload["meta"], **job.payload["aliases"]},
                              p.advance)
        elif isinstance(tmp, atomic.AtomicDir) and job.fmt == writers.SHARDED:
            from ...writers.safetensors.sharded import write_sharded

            limit = job.shard_bytes or 1
            p.start("writing", sum(t.nbytes for t in job.payload["stored"]))
            shards = write_sharded(tmp.path, tmp.create, job.payload["stored"], job.payload["aliases"],
                                   job.payload["meta"], limit, p.advance)
            big = [t.key for t in job.payload["stored"] if t.nbytes > limit]
            if big:
                job.warnings.append(f"{len(big)} tensor(s) are larger than --max-shard-size and have a shard "
                                    f"of their own: {', '.join(big[:3])}")
        elif isinstance(tmp, atomic.AtomicDir) and job.fmt == writers.DCP:
            from ...writers.dcp import write_dcp

            p.start("writing", sum(t.nbytes for t in job.tensors))
            write_dcp(tmp.path, job.tensors, p.advance)
        p.done()
        from .verify.casts import judge_casts

        refused = judge_casts(job)
        if refused:  # values lost to a cast: nothing is verified or published
            return MigrateReport(**job.report_args, verified={"cpu": False}, device_status={"cpu": "failed"},
                                 failures=tuple(refused), warnings=tuple(job.warnings))
        tmp.finish(background=job.verify)  # the fsync overlaps the verification's reads
        size = _size(tmp.path)
        if job.after_write is not None:
            job.after_write(tmp.path)
        verified, failures = _verify(job, tmp.path)
        if job.report_args.get("sanitized") is not None and job.verify and not failures:
            from .verify.weights_only import load_weights_only

            outcome, problem = load_weights_only(tmp.path)
            job.report_args["weights_only_load"] = outcome
            if problem is not None:
                failures.append(problem)
            elif outcome != "passed":
                job.warnings.append(f"torch.load(weights_only=True) of the output {outcome}")
        status = {**{d: ("passed" if ok else "failed") for d, ok in verified.items()}, **job.status}
        if not job.verify:
            status = {"all": "not verified (--no-verify)"}
            job.warnings.append("not verified (--no-verify)")
        if failures:
            return MigrateReport(**job.report_args, verified=verified, device_status=status,
                                 failures=tuple(failures), shards=tuple(shards), warnings=tuple(job.warnings))
        tmp.publish(replace=job.force)
    if job.verify:
        job.report_args["checks"] = checks_done(job)
    return MigrateReport(**job.report_args, written=True, verified=verified, device_status=status,
                         shards=tuple(shards), bytes_written=size, warnings=tuple(job.warnings))


def checks_done(job: Job) -> tuple[str, ...]:
    """What a passed verification proved, in words, for the ``verified:`` line (the target load is added there)."""
    from ... import dtypes

    plan = job.report_args.get("plan")
    out = []
    if plan is not None:
        dropped = len(plan.dropped)
        out.append(f"all {len(plan.entries) - dropped} kept source tensors present"
                   + (f", {dropped} dropped by your rules" if dropped else ""))
    out.append("every tensor re-read and compared bit for bit")
    quantized = sum(1 for t in job.tensors if dtypes.lookup(t.dtype).is_quantized)
    if quantized:
        out.append(f"{quantized} quantized tensor(s) with their scales and zero points")
    losses = job.report_args.get("cast_loss") or ()
    if losses:
        bad = sum(c.loss.overflowed for c in losses)
        flushed = sum(c.loss.flushed for c in losses)
        out.append(f"{len(losses)} cast(s) counted: {bad} value(s) became inf/NaN or were clamped"
                   + (" (--allow-overflow)" if bad else "") + f", {flushed} flushed to zero")
    return tuple(out)


def _size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def _verify(job: Job, path: str) -> tuple[dict[str, bool], list[str]]:
    """(device -> passed, first problems) for the temporary output at ``path``."""
    if not job.verify:
        return {}, []
    from .verify.verify import verify_output

    others = [d for d in job.devices if d != "cpu"]
    if others and any(t.source.quantizer is not None for t in job.tensors):
        job.warnings.append(f"quantized tensors have CPU kernels only: on {', '.join(others)} they were not "
                            "round-tripped" + (" and the target was loaded on the CPU only" if job.target else ""))

    return verify_output(path, job.fmt, job.tensors, pickled_root=job.payload.get("root"),
                         sd_key=job.payload.get("sd_key", ""), devices=job.devices, target=job.target,
                         target_kwargs=job.target_kwargs, allow_missing=job.allow_missing, limits=job.limits,
                         progress=job.progress, plan=job.report_args.get("plan"))
