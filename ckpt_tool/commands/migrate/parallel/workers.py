"""Writing one migrate output from several processes: ``--workers N``, or every rank under ``torchrun``.

The output (one ``.safetensors`` file, or a sharded set) is cut into units
fixed before any byte is written (writers/parallel.py) and the units are
shared out. The process that owns the output (the migrate process, or rank
0) creates the temporary output and its header; every process writes its
share with its own descriptors and fsyncs it, then, once all have written,
verifies its share bit for bit against the source. The owner then writes
the index, checks the whole output's keys, dtypes and shapes, runs the
device and target checks, and publishes it. Workers are separate
processes that re-read the source's metadata and re-plan the same output
(checked by a fingerprint), so nothing but a small spec crosses a process
boundary, as on a cluster where each rank runs the same command.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from .... import writers
from ....errors import CkptError, UsageError, WriteError
from ....format_names import Format
from ....io.atomic import renames
from ....io.atomic import write as atomic
from ....io.paths import count_remote, remote_session
from ....keys.rules import RuleSet, make_plan
from ....limits import Limits
from ....model import TensorMeta
from ....writers.base import OutTensor
from ....writers.parallel import Unit, assign, safetensors_units, shard_units, write_unit
from ..verify.casts import apply_losses, judge_casts, share_losses
from .torchrun import Dist

PARALLEL_FORMATS = (writers.SAFETENSORS, writers.SHARDED)
CONSOLIDATION_SOURCES = (Format.DEEPSPEED, Format.DCP)
MIN_SHARE_BYTES = 256 << 20  # the default worker count gives each process at least this much to write


def choose_workers(requested: int | None, source_format: str, fmt: str, total: int) -> int:
    """Processes for this output: as asked, else (consolidation sources only) the cores the size warrants."""
    if requested is not None and requested < 1:
        raise UsageError(f"--workers {requested}: give 1 or more")
    if fmt not in PARALLEL_FORMATS:
        return 1
    if requested is not None:
        return requested
    if source_format not in CONSOLIDATION_SOURCES:
        return 1
    return max(1, min(os.cpu_count() or 1, total // MIN_SHARE_BYTES))


@dataclass(frozen=True)
class Spec:
    """What a worker needs to re-plan the same output and write its share (small and picklable)."""

    src: str
    key: str | None
    unsafe: bool
    limits: Limits
    rules: RuleSet
    fmt: str
    shard_bytes: int | None
    meta: dict[str, str]
    count: int = 1
    path: str = ""
    fingerprint: str = ""
    verify: bool = True


def stored_tensors(tensors: Sequence[TensorMeta], rules: RuleSet) -> tuple[list[OutTensor], dict[str, str]]:
    """(tensors stored once, alias -> stored key): what migrate plans for a safetensors output."""
    from ....writers.layout import dedupe

    plan = make_plan(tensors, rules)
    by_key = {t.key: t for t in tensors}
    out = [OutTensor(e.output, by_key[e.source], e.cast or e.dtype) for e in plan.entries if e.output is not None]
    stored, aliases, _ = dedupe(out)
    return stored, aliases


def plan_units(fmt: str, stored: Sequence[OutTensor], aliases: dict[str, str], meta: dict[str, str],
               shard_bytes: int | None, count: int) -> tuple[bytes, list[Unit]]:
    """(header of a single-file output, or b"", the units to share out)."""
    if fmt == writers.SHARDED:
        return b"", shard_units(stored, aliases, meta, shard_bytes or 1)
    return safetensors_units(stored, {**meta, **aliases}, count)


def fingerprint(header: bytes, units: Sequence[Unit]) -> str:
    h = hashlib.sha256(header)
    for u in units:
        h.update(repr((u.name, u.offset, [(t.key, t.dtype, t.shape, t.nbytes) for t in u.tensors],
                       u.shard.metadata if u.shard else None)).encode())
    return h.hexdigest()


def write_share(path: str, units: Sequence[Unit], indices: Sequence[int], on_bytes: Any = None,
                sync: bool = True) -> int:
    return sum(write_unit(path, units[i], on_bytes, sync) for i in indices)


def verify_share(path: str, fmt: str, units: Sequence[Unit], indices: Sequence[int], limits: Limits) -> list[str]:
    """Each tensor of the share re-read from the output and compared bit for bit with the source."""
    from ....formats import read_file
    from ....formats.checkpoint.loaded import ReadOptions
    from ..verify.compare import MAX_REPORTED, compare_pairs

    problems: list[str] = []
    files: dict[str, list[Unit]] = {}
    for i in indices:
        files.setdefault(os.path.join(path, units[i].name) if units[i].name else path, []).append(units[i])
    for file, group in files.items():
        try:
            loaded = read_file(file, ReadOptions(limits=limits))
        except CkptError as exc:
            return [f"the output cannot be read back: {exc.message}"]
        try:
            actual = dict(loaded.root)
            pairs = []
            for unit in group:
                for t in unit.tensors:
                    found = actual.get(t.key)
                    if found is None:
                        problems.append(f"{t.key}: missing from the output")
                    else:
                        pairs.append((t.key, t, found))
            problems += compare_pairs(pairs)
        finally:
            for s in loaded.sources:
                s.close()
        if len(problems) >= MAX_REPORTED:
            break
    return problems[:MAX_REPORTED]


def replan(spec: Spec) -> tuple[list[Unit], Any]:
    """A worker's own plan of the same output (its units and the checkpoint to close)."""
    from ....formats import load

    ck = load(spec.src, key=spec.key, unsafe=spec.unsafe, limits=spec.limits)
    stored, aliases = stored_tensors(ck.tensors, spec.rules)
    header, units = plan_units(spec.fmt, stored, aliases, spec.meta, spec.shard_bytes, spec.count)
    if fingerprint(header, units) != spec.fingerprint:
        ck.close()
        raise UsageError("a worker planned another output than the first process: did the source change while "
                         "it was converted?", spec.src)
    return units, ck


def _child(conn: Connection, spec: Spec, index: int) -> None:
    """A worker process: write share ``index``, then verify it when told to."""
    ck = None
    try:
        with remote_session(spec.src) as counted:  # a URL source: what this process fetched, for the report
            units, ck = replan(spec)
            indices = assign(units, spec.count)[index]
            written = write_share(spec.path, units, indices, sync=False)  # the owner fsyncs
        losses = share_losses([t for i in indices for t in units[i].tensors])  # what its casts did to the values
        conn.send(("written", written, counted.stats() if counted is not None else None, losses))
        if conn.recv() == "verify":
            conn.send(("verified", verify_share(spec.path, spec.fmt, units, indices, spec.limits)
                       if spec.verify else []))
    except CkptError as exc:
        conn.send(("error", type(exc), exc.message))
    except KeyboardInterrupt:
        pass
    finally:
        if ck is not None:
            ck.close()
        conn.close()


def _context() -> Any:
    # fork starts a worker in milliseconds; elsewhere (macOS, Windows) spawn re-imports ckpt_tool
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


class _Workers:
    """Processes writing shares 1..count-1 while this one writes share 0."""

    def __init__(self, spec: Spec) -> None:
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.losses: list[Any] = []  # (key, CastLoss) of the casts the workers wrote
        ctx = _context()
        for index in range(1, spec.count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_child, args=(child, spec, index), name=f"ckpt-worker-{index}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def collect(self, what: str) -> list[Any]:
        """Each worker's answer (``written`` bytes or ``verified`` problems); raises the first error."""
        answers: dict[int, Any] = {}
        pending = {c: i for i, c in enumerate(self.conns)}
        while pending:
            for conn in wait(list(pending)):
                i = pending.pop(conn)  # type: ignore[call-overload]
                try:
                    msg = conn.recv()  # type: ignore[union-attr,call-arg]
                except EOFError:
                    self.procs[i].join(timeout=5)
                    code = self.procs[i].exitcode
                    raise CkptError(f"worker {i + 1} ended without a result (exit code {code})") from None
                if msg[0] == "error":
                    raise msg[1](msg[2])  # type: ignore[operator]  # the worker's exception class and message
                if msg[0] != what:
                    raise CkptError(f"worker {i + 1} answered {msg[0]!r}, expected {what!r}")
                answers[i] = msg[1]
                if what == "written" and len(msg) > 3:
                    counted: Any = msg[3]
                    self.losses.extend(counted)
                fetched: Any = msg[2] if len(msg) > 2 else None  # the requests a worker made for a URL source
                if fetched:
                    count_remote(fetched["requests"], fetched["bytes"])
        return [answers[i] for i in range(len(self.conns))]

    def tell(self, message: str) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(message)

    def close(self) -> None:
        self.tell("stop")
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self.conns:
            conn.close()


def write_parallel(job: Any, spec: Spec, dist: Dist | None) -> dict[str, Any]:
    """Write, verify and publish ``job``'s output (migrate_write.Job) from several processes.

    Returns the MigrateReport fields the write decides (written, verified, ...).
    """
    stored, aliases, meta = job.payload["stored"], job.payload["aliases"], job.payload["meta"]
    count = dist.world if dist is not None else spec.count
    header, units = plan_units(job.fmt, stored, aliases, meta, job.shard_bytes, count)
    spec = replace(spec, count=count, fingerprint=fingerprint(header, units), verify=job.verify)
    mine = assign(units, count)[dist.rank if dist is not None else 0]
    leader = dist is None or dist.leader
    if dist is not None:
        dist.start()
        if len(set(dist.gather(spec.fingerprint))) > 1:
            raise UsageError("the ranks planned different outputs: give every rank the same command and source")
    folder = job.fmt == writers.SHARDED
    tmp: Any = (atomic.AtomicDir(job.out) if folder else atomic.AtomicFile(job.out)) if leader else None
    with tmp if tmp is not None else contextlib.nullcontext():
        path = tmp.path if leader else ""
        if leader and not folder:
            os.pwrite(tmp.fd, header, 0)
            os.ftruncate(tmp.fd, len(header) + sum(t.nbytes for t in stored))
        if dist is not None:
            path = dist.broadcast(path)
        outcome = _run(job, replace(spec, path=path), units, mine, dist, tmp)
        if leader:
            outcome = _finish(job, tmp, units, outcome)
        if dist is not None:
            outcome = dist.broadcast(outcome)
    return outcome


def _run(job: Any, spec: Spec, units: list[Unit], mine: list[int], dist: Dist | None, tmp: Any) -> dict[str, Any]:
    """Write every share and verify it; the failures found."""
    p = job.progress
    p.start("writing", sum(u.nbytes for u in units))
    workers = _Workers(spec) if dist is None and spec.count > 1 else None
    try:
        error: tuple[type, str] | None = None
        try:
            write_share(spec.path, units, mine, p.advance, sync=dist is not None)
        except (CkptError, OSError) as exc:
            if dist is None:
                raise
            # every rank must reach the gather below, or the others would wait for it until the timeout
            error = (type(exc), exc.message) if isinstance(exc, CkptError) else (WriteError, f"cannot write: {exc}")
        if workers is not None:
            for i, _written in enumerate(workers.collect("written")):
                p.advance(sum(units[k].nbytes for k in assign(units, spec.count)[i + 1]))
        if dist is not None:
            errors = [e for e in dist.gather(error) if e is not None]
            if errors:
                raise errors[0][0](errors[0][1])
        p.done()
        losses = share_losses([t for i in mine for t in units[i].tensors]) + (workers.losses if workers else [])
        if dist is not None:
            losses = [x for part in dist.gather(losses) for x in part]
        apply_losses(job.tensors, dict(losses))
        refused = judge_casts(job)
        if refused:  # values lost to a cast: nothing is verified or published
            return {"failures": refused}
        if dist is None:
            tmp.finish(background=job.verify)  # one fsync of every writer's pages, overlapping the verification
        if (dist is None or dist.leader) and job.after_write is not None:
            job.after_write(spec.path)
        if dist is not None:
            dist.barrier()
        failures: list[str] = []
        if job.verify:
            p.start("verifying", sum(units[i].nbytes for i in mine))
            if workers is not None:
                workers.tell("verify")
            failures = verify_share(spec.path, spec.fmt, units, mine, spec.limits)
            if workers is not None:
                for found in workers.collect("verified"):
                    failures += found
            if dist is not None:
                failures = [f for found in dist.gather(failures) for f in found]
            p.done()
        return {"failures": failures}
    finally:
        if workers is not None:
            workers.close()


def _finish(job: Any, tmp: Any, units: list[Unit], outcome: dict[str, Any]) -> dict[str, Any]:
    """The owner's part: index, fsync, whole-output checks, publish."""
    failures = list(outcome["failures"])
    shards = [u.name for u in units if u.shard is not None]
    if job.fmt == writers.SHARDED:
        from ....writers.output import write_all
        from ....writers.safetensors.sharded import INDEX_NAME, index_bytes

        fd = tmp.create(INDEX_NAME)
        try:
            write_all(fd, index_bytes([u.shard for u in units if u.shard is not None]))
            os.fsync(fd)
        finally:
            os.close(fd)
        renames.fsync_dir(tmp.path)
        big = [t.key for u in units for t in u.tensors if t.nbytes > (job.shard_bytes or 1)]
        if big:
            job.warnings.append(f"{len(big)} tensor(s) are larger than --max-shard-size and have a shard "
                                f"of their own: {', '.join(big[:3])}")
    if job.dist is not None:
        # the ranks fsynced their own writes; this flushes the owner's (publish waits for a background one)
        tmp.finish()
    verified: dict[str, bool] = {}
    if job.verify:
        if not failures:
            from .check import check_whole

            verified, failures = check_whole(job, tmp.path)
        else:
            verified = {"cpu": False}
    status = {**{d: ("passed" if ok else "failed") for d, ok in verified.items()}, **job.status}
    if not job.verify:
        status = {"all": "not verified (--no-verify)"}
        job.warnings.append("not verified (--no-verify)")
    result: dict[str, Any] = {"verified": verified, "device_status": status, "shards": tuple(shards),
                              "warnings": tuple(job.warnings)}
    if failures:
        return {**result, "failures": tuple(failures), "written": False, "bytes_written": 0}
    size = os.path.getsize(tmp.path) if not os.path.isdir(tmp.path) else sum(
        os.path.getsize(os.path.join(tmp.path, n)) for n in os.listdir(tmp.path))
    tmp.publish(replace=job.force)
    return {**result, "failures": (), "written": True, "bytes_written": size}
