"""``ckpt migrate``: plan -> atomic write -> verify, without ever losing data.

Everything that can be wrong with a migration (rule conflicts, a target the
result would not load into, placeholders that cannot be written back, an
existing output) is found before the first byte is written. The output is
written beside its final path, fsynced, re-read with ckpt's own readers and
compared bit for bit with what the rules say, loaded into the target on each
device when one is given, and only then renamed into place. A failed
verification leaves no output (and an old output, with --force, untouched).
Before writing, the stale temporaries of killed runs in OUT's folder are
removed, and an output that would not fit in the free space is refused.
The options become a frozen plan first (commands/migrate/plan.py); the
steps below read it, and the write, verify and publish steps are
commands/migrate/write.py.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ... import dtypes
from ...errors import InputError, UsageError
from ...format_names import OutputFormat
from ...formats import SourceOptions, read_checkpoint
from ...formats.checkpoint import resolve_key
from ...io.atomic import destination, freespace, interrupts, staletemp
from ...io.remote import counts_remote
from ...keys import Plan, RuleSet, make_plan
from ...model import Checkpoint, TensorMeta
from ...writers import OutTensor, Payload, require_data
from .exact import refuse_quantized_rewrites, refuse_subclasses
from .job import WriteJob
from .plan import NO_HOOKS, Hooks, MigrateOptions, MigratePlan, build_rules, plan_migration
from .report import MigrateReport, TargetCheck
from .shape import refuse_opaque, shape_output
from .write import write_and_publish

if TYPE_CHECKING:
    from ...tensors.target import Target

_SHARED_NOTE = re.compile(r"\d+ tensors share storage")


def check_target(spec: str, tensors: Sequence[OutTensor], target_tensors: Sequence[TensorMeta],
                 allow_missing: Sequence[str], lazy: Sequence[str] = ()) -> TargetCheck:
    """How the planned tensors compare with the target's, before anything is written."""
    from ...model import shapes_compatible

    have = {t.key: t for t in tensors}
    want = {t.key for t in target_tensors}
    missing = [t.key for t in target_tensors if t.key not in have]
    allowed = [k for k in missing if any(fnmatch.fnmatchcase(k, g) for g in allow_missing)]
    shape_bad = []
    for tt in target_tensors:
        t = have.get(tt.key)
        if t is not None and tt.key not in lazy and not shapes_compatible(tuple(t.shape), tuple(tt.shape)):
            shape_bad.append((tt.key, list(t.shape), list(tt.shape)))
    return TargetCheck(
        spec, tuple(k for k in missing if k not in allowed), tuple(t.key for t in tensors if t.key not in want),
        tuple(shape_bad), tuple(allowed),
    )


_PACKED_MEMBER = re.compile(r".*_packed_params\.\d+")


def keep_packed_dtypes(plan: Plan) -> tuple[Plan, list[str]]:
    """The plan without casts of the tensors inside packed params (formats/locate.packed_items), and their keys.

    A quantized Linear's packed bias must stay float32: torch's prepack
    refuses another dtype when the output is loaded.
    """
    kept = [e.source for e in plan.entries if e.cast and _PACKED_MEMBER.fullmatch(e.source)]
    if not kept:
        return plan, []
    entries = tuple(e._replace(cast=None) if e.source in set(kept) else e for e in plan.entries)
    return Plan(entries, plan.rules), kept


def _source_paths(src: str, ck: Checkpoint) -> list[str]:
    paths = {os.path.abspath(src)}
    for s in ck.sources:
        p = getattr(s, "path", None)
        if isinstance(p, str) and os.path.exists(p):
            paths.add(os.path.abspath(p))
    return sorted(paths)


@counts_remote("src")  # a URL source: remote {requests, bytes} in the report
def run_migration(src: str | os.PathLike[str], out: str | os.PathLike[str] | None, source: SourceOptions,
                  options: MigrateOptions, hooks: Hooks = NO_HOOKS) -> MigrateReport:
    """Rewrite SRC's keys (and format, and dtype) into OUT: plan it (plan.plan_migration), then carry it out."""
    return execute(plan_migration(src, out, source, options), hooks)


def execute(plan: MigratePlan, hooks: Hooks = NO_HOOKS) -> MigrateReport:
    """Carry out a plan: read the source, then every check, write, verify and publish (the module docstring)."""
    ck = read_checkpoint(plan.source.path, plan.source, read_values=True)  # read_values: a DCP folder's values
    try:
        return run_plan(ck, plan, hooks)
    finally:
        ck.close()


def run_plan(ck: Checkpoint, plan: MigratePlan, hooks: Hooks) -> MigrateReport:
    """Carry out ``plan`` on the loaded source: every check first, then write, verify and publish."""
    # ties are handled (kept, or stored once with aliases) and reported by migrate itself
    warnings = [w for w in ck.warnings if not _SHARED_NOTE.match(w)]
    if not ck.tensors:
        raise UsageError("the source holds no tensors to migrate (use --key to pick the state_dict)", plan.source.path)
    # 1. rules, inferred ones first
    built, plan, inferred = _rules_for_target(ck, plan, hooks, warnings)
    # 2. the tensors; every conflict raises here, before anything is written
    key_plan, tensors = _plan_tensors(ck, plan, warnings)
    v = plan.verification
    check = check_target(v.target or "", tensors, built.tensors, v.allow_missing, built.lazy) \
        if built is not None else None
    # 3. the output's shape: container, metadata, ties
    chosen = resolve_key(ck.root, ck.state_dict_key or "", plan.source.path) if ck.state_dict_key else ck.root
    if built is not None:
        refuse_opaque(built, chosen, plan.rules)
    shaped = shape_output(ck, plan, chosen, tensors)
    warnings += shaped.warnings
    # 4. where it goes, and on which devices it will be proven
    run_devices, status = _devices(v.enabled and not plan.output.dry_run, v.devices)
    report = MigrateReport(
        source=plan.source.path, output=plan.output.path, format=plan.output.format, source_format=ck.format,
        plan=key_plan, tensors=tensors, rules=plan.rules, inferred=inferred, target=check,
        metadata_kept=shaped.metadata_kept, aliases=shaped.aliases, sanitized=shaped.sanitized,
        device_status=status, warnings=tuple(warnings),
        copied=plan.output.hf.files if plan.output.hf else (), left_out=plan.output.hf.left if plan.output.hf else (),
        source_options=_source_options(plan))
    stopped = _before_writing(report, plan)
    if stopped is not None:
        return stopped
    return _write(ck, plan, hooks, report, shaped.payload, tuple(run_devices))


def _source_options(plan: MigratePlan) -> tuple[str, ...]:
    """The options that changed how the source was read (the rules line says them beside the key rules)."""
    s = plan.source
    return ((f"--tp-rules {shlex.quote(s.tp_rules.origin)}",) if s.tp_rules is not None else ()) + (
        ("--unstack-layers",) if s.unstack_layers else ())


def _rules_for_target(ck: Checkpoint, plan: MigratePlan, hooks: Hooks,
                      warnings: list[str]) -> tuple[Target | None, MigratePlan, RuleSet | None]:
    """(the built target, the plan with the rules --auto inferred for it, those rules)."""
    v = plan.verification
    if not v.target:
        return None, plan, None
    from ...tensors.target import build_target

    built = build_target(v.target, dict(v.target_kwargs) if v.target_kwargs is not None else None)
    warnings += [f"target: {w}" for w in built.warnings]
    if not v.auto:
        return built, plan, None
    from ...keys import suggest

    pre = make_plan(ck.tensors, plan.rules)
    renamed_view = [TensorMeta(e.output, t.dtype, t.shape) for e, t in zip(pre.entries, ck.tensors, strict=True)
                    if e.output is not None]
    found = suggest(renamed_view, built.tensors, lazy=built.lazy)
    inferred = found.rules if found is not None else RuleSet()
    if found is not None:
        plan = replace(plan, rules=plan.rules.then(inferred) if not plan.rules.is_empty else inferred)
    if hooks.on_rules is not None:
        hooks.on_rules(inferred)
    return built, plan, inferred


def _plan_tensors(ck: Checkpoint, plan: MigratePlan, warnings: list[str]) -> tuple[Plan, tuple[OutTensor, ...]]:
    """(the key plan, the output tensors) of the rules; what no output of this format can hold raises."""
    key_plan, kept_dtype = keep_packed_dtypes(make_plan(ck.tensors, plan.rules))
    if kept_dtype:
        warnings.append(f"not cast: {len(kept_dtype)} tensor(s) inside quantized layers' packed params keep their "
                        f"dtype, which the quantized kernels require ({', '.join(kept_dtype[:3])})")
    by_key = ck.by_key
    tensors = tuple(OutTensor(e.output, by_key[e.source], e.cast or e.dtype) for e in key_plan.entries
                    if e.output is not None)
    if not tensors:
        raise UsageError("the rules drop every tensor; nothing would be written")
    fmt = plan.output.format
    refuse_subclasses(tensors, fmt, plan.output.sanitize)
    refuse_quantized_rewrites(ck, plan, tensors)
    for t in tensors:
        if t.source.subclass is None:
            require_data(t)
    quantized = [t.key for t in tensors if dtypes.lookup(t.dtype).is_quantized]
    if quantized and fmt is not OutputFormat.TORCH_ZIP:
        shown = ", ".join(repr(k) for k in quantized[:5]) + (f" and {len(quantized) - 5} more" if len(quantized) > 5
                                                              else "")
        raise UsageError(f"a {fmt} output cannot hold quantized tensors (their scale and zero point): {shown}; "
                         "write a .pth, or leave them out with --drop")
    unquantized = [t.key for t in tensors if dtypes.lookup(t.dtype).is_quantized and t.source.quantizer is None]
    if unquantized:
        raise InputError(f"quantized tensor {unquantized[0]!r} was read without its quantizer; it cannot be "
                         "written back")
    if any(t.source.device not in ("cpu", "meta") for t in tensors):
        warnings.append("tensors saved on a GPU are written as CPU tensors (torch.load needs no map_location)")
    return key_plan, tensors


def _before_writing(report: MigrateReport, plan: MigratePlan) -> MigrateReport | None:
    """The report when nothing is to be written: a failed target check, a dry run, a rank with no share."""
    if report.target is not None and not report.target.ok:
        return replace(report, dry_run=plan.output.dry_run)
    out = plan.output
    if out.dry_run:
        exists = out.path is not None and os.path.lexists(out.path)
        more = (f"{out.path} exists{'' if out.force else '; the real run needs --force'}",) if exists else ()
        return replace(report, dry_run=True, warnings=report.warnings + more)
    from .parallel import PARALLEL_FORMATS

    dist = plan.parallelism.dist
    if dist is not None and not dist.leader and out.format not in PARALLEL_FORMATS:
        return replace(report, warnings=(f"rank {dist.rank}: a {out.format} output is written by rank 0 alone",))
    return None


def _write(ck: Checkpoint, plan: MigratePlan, hooks: Hooks, report: MigrateReport, payload: Payload,
           devices: tuple[str, ...]) -> MigrateReport:
    """Make room for the output beside OUT, then write, verify and publish it."""
    from ...writers import sizes
    from .parallel import PARALLEL_FORMATS, choose_workers

    out, fmt = plan.output.path, plan.output.format
    if out is None:
        raise UsageError("give the output path with -o OUT")
    folder = plan.output.folder
    destination.check_destination(out, _source_paths(plan.source.path, ck), force=plan.output.force, folder=folder)
    if folder and plan.output.force:
        from ...writers import writer

        hf = plan.output.hf
        destination.check_replaceable_folder(out, writer(fmt).suffixes, hf.files if hf is not None else ())
    # 5. room for it: stale temporaries of killed runs go first, then the free space must hold every file
    dist = plan.parallelism.dist
    warnings = list(report.warnings)
    cleaned = _clean_stale(out, hooks.on_cleaned, warnings) if dist is None or dist.leader else ()
    tensors, shard_bytes, weights = report.tensors, plan.output.shard_bytes, plan.output.weights_format
    side = side_file_sizes(plan)
    bound: tuple[int, int] | None = sizes.quick_bound(weights, out, tensors, payload, shard_bytes)
    if bound is not None and side:  # (None: the caller wants the exact sizes computed)
        bound = (bound[0] + sum(side), bound[1] + len(side))
    freespace.require(out, lambda: sizes.planned_sizes(weights, out, tensors, payload, shard_bytes) + side,
                      bound)  # --force too
    if fmt not in PARALLEL_FORMATS:
        plan = replace(plan, parallelism=replace(plan.parallelism, dist=None))
        asked = plan.parallelism.workers
        if asked is not None and asked > 1:
            warnings.append(f"--workers {asked}: a {fmt} output is written by this one process (only .safetensors "
                            "and sharded safetensors outputs are written in parallel)")
    job = WriteJob(plan=plan, hooks=hooks, out=out, tensors=tensors, payload=payload, devices=devices,
                   workers=choose_workers(plan.parallelism.workers, ck.format, fmt, sum(t.nbytes for t in tensors)),
                   report=replace(report, cleaned=cleaned, warnings=tuple(warnings)))
    # 6. write, verify, publish
    with interrupts.interrupts_as_exceptions():
        return write_and_publish(job)


def side_file_sizes(plan: MigratePlan) -> list[int]:
    """The sizes of the files a Hugging Face folder output copies from the source folder."""
    from ...io import paths

    hf = plan.output.hf
    if hf is None or hf.copy_from is None:
        return []
    out = []
    for rel in hf.files:
        with paths.open_bytes(paths.join(hf.copy_from, rel)) as data:
            out.append(data.size)
    return out


def _clean_stale(out: str, on_cleaned: Callable[[staletemp.CleanReport], None] | None,
                 warnings: list[str]) -> tuple[staletemp.Temporary, ...]:
    """Remove the temporaries dead writers left in OUT's folder (never a live writer's)."""
    found = staletemp.clean(os.path.dirname(os.path.abspath(out)))
    for t in found.failed:
        warnings.append(f"could not remove the stale temporary {t.path}: {t.error}")
    if on_cleaned is not None and (found.removed or found.failed):
        on_cleaned(found)
    return found.removed


def _devices(active: bool, devices: Sequence[str] | None) -> tuple[list[str], dict[str, str]]:
    """(devices to prove the output on, status of those that cannot be); none when nothing is verified."""
    if not active:
        return [], {}
    from .verify import resolve_devices

    return resolve_devices(devices)


__all__ = ["Hooks", "MigrateOptions", "MigratePlan", "build_rules", "check_target", "execute", "keep_packed_dtypes",
           "plan_migration", "run_migration", "run_plan"]

