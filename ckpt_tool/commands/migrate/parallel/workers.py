"""Writing one migrate output from several processes: ``--workers N``, or every rank under ``torchrun``.

The output (one ``.safetensors`` file, or a sharded set) is cut into units
fixed before any byte is written (writers/shares.py) and the units are
shared out. The process that owns the output (the migrate process, or rank
0) creates the temporary output and its header; every process writes its
share with its own descriptors, then, once all have written and the owner
wrote the index and fsynced, compares its share bit for bit with the
source. The owner then hands those proofs to the one verifier and publishes
the output (publish.py, owner.py). Workers are separate
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

from ....errors import CkptError, UsageError
from ....format_names import OutputFormat
from ....io import count_remote, remote_session
from ....keys import RuleSet, make_plan
from ....limits import Limits
from ....model import Checkpoint, TensorMeta
from ....tensors.numerics import CastLoss
from ....writers import OutTensor, Unit, assign, safetensors_units, shard_units, write_unit, writer
from ..verify import share_losses

if TYPE_CHECKING:
    from ..plan import SourcePlan


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What a worker needs to re-plan the same output and write its share (small and picklable)."""

    source: SourcePlan
    rules: RuleSet
    fmt: OutputFormat
    shard_bytes: int | None
    meta: Mapping[str, str] = field(default_factory=dict)
    count: int = 1
    path: str = ""
    fingerprint: str = ""
    verify: bool = True


def stored_tensors(tensors: Sequence[TensorMeta], rules: RuleSet) -> tuple[list[OutTensor], dict[str, str]]:
    """(tensors stored once, alias -> stored key): what migrate plans for a safetensors output."""
    from ....writers import dedupe

    plan = make_plan(tensors, rules)
    by_key = {t.key: t for t in tensors}
    out = [OutTensor(e.output, by_key[e.source], e.cast or e.dtype) for e in plan.entries if e.output is not None]
    stored, aliases, _ = dedupe(out)
    return stored, aliases


def plan_units(fmt: OutputFormat, stored: Sequence[OutTensor], aliases: Mapping[str, str], meta: Mapping[str, str],
               shard_bytes: int | None, count: int) -> tuple[bytes, list[Unit]]:
    """(header of a single-file output, or b"", the units to share out): whole shard files of a folder output,
    runs of tensors of a file."""
    if writer(fmt).folder:
        return b"", shard_units(stored, aliases, meta, shard_bytes or 1)
    return safetensors_units(stored, {**meta, **aliases}, count)


def fingerprint(header: bytes, units: Sequence[Unit]) -> str:
    """A digest of the planned layout: every process must have planned the same one."""
    h = hashlib.sha256(header)
    for u in units:
        h.update(repr((u.name, u.offset, [(t.key, t.dtype, t.shape, t.nbytes) for t in u.tensors],
                       u.shard.metadata if u.shard else None)).encode())
    return h.hexdigest()


def write_share(path: str, units: Sequence[Unit], indices: Sequence[int],
                on_bytes: Callable[[int], None] | None = None, sync: bool = True) -> int:
    """Write the units at ``indices``; their bytes."""
    return sum(write_unit(path, units[i], on_bytes, sync) for i in indices)


def prove_share(path: str, units: Sequence[Unit], indices: Sequence[int],
                limits: Limits) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Each tensor of the share re-read from the output and compared bit for bit with the source: (the first
    problems, key -> (file offset, bytes) of the tensors found equal, handed to the one verifier)."""
    from ..verify import MAX_REPORTED, by_key, close_output, compare_pairs, open_output, span_of, unreadable

    problems: list[str] = []
    proven: dict[str, tuple[int, int]] = {}
    files: dict[str, list[Unit]] = {}
    for i in indices:
        files.setdefault(os.path.join(path, units[i].name) if units[i].name else path, []).append(units[i])
    for file, group in files.items():
        try:
            loaded = open_output(file, limits)
        except CkptError as exc:
            return [unreadable(exc.message)], {}
        try:
            actual = by_key(loaded)
            pairs = []
            for unit in group:
                for t in unit.tensors:
                    found = actual.get(t.key)
                    if found is None:
                        problems.append(f"{t.key}: missing from the output")
                    else:
                        pairs.append((t.key, t, found))
            differ = compare_pairs(pairs)
            problems += differ
            if not differ:
                proven.update((key, span) for key, _, act in pairs if (span := span_of(act)) is not None)
        finally:
            close_output(loaded)
        if len(problems) >= MAX_REPORTED:
            break
    return problems[:MAX_REPORTED], proven


def replan(spec: Spec) -> tuple[list[Unit], Checkpoint]:
    """A worker's own plan of the same output (its units and the checkpoint to close)."""
    from ....formats import load

    s = spec.source
    ck = load(s.path, key=s.key, unsafe=s.unsafe, limits=s.limits, tp_rules=s.tp_rules,
              unstack_layers=s.unstack_layers)
    stored, aliases = stored_tensors(ck.tensors, spec.rules)
    header, units = plan_units(spec.fmt, stored, aliases, spec.meta, spec.shard_bytes, spec.count)
    if fingerprint(header, units) != spec.fingerprint:
        ck.close()
        raise UsageError("a worker planned another output than the first process: did the source change while "
                         "it was converted?", spec.source.path)
    return units, ck


@dataclass(frozen=True)
class _Wrote:
    """A worker's answer once its share is written: bytes, remote requests, what its casts did."""

    nbytes: int
    fetched: dict[str, int] | None
    losses: list[tuple[str, CastLoss]]


@dataclass(frozen=True)
class _Verified:
    """A worker's answer once its share is re-read: the first problems found, and what it proved."""

    problems: list[str]
    proven: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class _Failed:
    """A worker's known error, raised again in the owner as the same class."""

    kind: type[CkptError]
    message: str


def _child(conn: Connection, spec: Spec, index: int) -> None:
    """A worker process: write share ``index``, then verify it when told to."""
    from ....tensors.numerics import fork_safe

    fork_safe()
    ck = None
    try:
        with remote_session(spec.source.path) as counted:  # a URL source: what this process fetched, for the report
            units, ck = replan(spec)
            indices = assign(units, spec.count)[index]
            written = write_share(spec.path, units, indices, sync=False)  # the owner fsyncs
        losses = share_losses([t for i in indices for t in units[i].tensors])  # what its casts did to the values
        conn.send(_Wrote(written, counted.stats() if counted is not None else None, losses))
        if conn.recv() == "verify":
            conn.send(_Verified(*prove_share(spec.path, units, indices, spec.source.limits)) if spec.verify
                      else _Verified([], {}))
    except CkptError as exc:
        conn.send(_Failed(type(exc), exc.message))
    except KeyboardInterrupt:
        pass
    finally:
        if ck is not None:
            ck.close()
        conn.close()


def _context() -> BaseContext:
    # fork starts a worker in milliseconds; elsewhere (macOS, Windows) spawn re-imports ckpt_tool
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


class Workers:
    """Processes writing shares 1..count-1 while this one writes share 0."""

    def __init__(self, spec: Spec) -> None:
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.losses: list[tuple[str, CastLoss]] = []  # (key, counts) of the casts the workers wrote
        ctx = _context()
        for index in range(1, spec.count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(  # type: ignore[attr-defined]  # every concrete context has Process
                target=_child, args=(child, spec, index), name=f"ckpt-worker-{index}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def _answers(self, what: type[_Wrote] | type[_Verified]) -> list[_Wrote | _Verified]:
        """Each worker's answer of kind ``what``, in worker order; raises the first error."""
        answers: dict[int, _Wrote | _Verified] = {}
        pending = {c: i for i, c in enumerate(self.conns)}
        while pending:
            for ready in wait(list(pending)):
                conn = ready if isinstance(ready, Connection) else None
                i = pending.pop(conn) if conn is not None else -1
                if conn is None:
                    raise CkptError("a worker's pipe is not a connection")  # wait() returns what it was given
                try:
                    msg: object = conn.recv()
                except EOFError:
                    self.procs[i].join(timeout=5)
                    code = self.procs[i].exitcode
                    raise CkptError(f"worker {i + 1} ended without a result (exit code {code})") from None
                if isinstance(msg, _Failed):
                    raise msg.kind(msg.message)  # the worker's exception class and message
                if not isinstance(msg, what):
                    raise CkptError(f"worker {i + 1} answered {type(msg).__name__}, expected {what.__name__}")
                answers[i] = msg
        return [answers[i] for i in range(len(self.conns))]

    def written(self) -> None:
        """Wait until every worker wrote its share; gather the casts' counts and the remote requests."""
        for msg in self._answers(_Wrote):
            if isinstance(msg, _Wrote):
                self.losses.extend(msg.losses)
                if msg.fetched:  # the requests a worker made for a URL source
                    count_remote(msg.fetched["requests"], msg.fetched["bytes"])

    def verified(self) -> list[tuple[list[str], dict[str, tuple[int, int]]]]:
        """Every worker's problems with its share and what it proved, in worker order."""
        return [(msg.problems, msg.proven) for msg in self._answers(_Verified) if isinstance(msg, _Verified)]

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
                proc.join(timeout=5)
            if proc.is_alive():  # stuck where no Python handler runs (inside a C call): SIGTERM never lands
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
