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
The write, verify and publish steps are commands/migrate/write.py.
"""
from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import dtypes, writers
from ...errors import InputError, UsageError
from ...formats import load
from ...formats.checkpoint.locate import resolve_key
from ...io.atomic import destination, freespace, interrupts, staletemp
from ...io.remote.counts import counts_remote
from ...keys.rules import Plan, RuleSet, load_rules_file, make_plan, parse_rename
from ...limits import DEFAULT_LIMITS, Limits
from ...model import Checkpoint, TensorMeta
from ...pickles.unpickle.placeholders import Placeholder
from ...writers.base import OutTensor, require_data
from ...writers.layout import dedupe, entries_holding_tensors, safetensors_metadata, torch_root
from .report import MigrateReport, TargetCheck
from .write import Job, NoProgress, Progress, write_and_publish

_SHARED_NOTE = re.compile(r"\d+ tensors share storage")


def build_rules(*, rules_file: str | None = None, strip_prefix: Sequence[str] = (), add_prefix: str | None = None,
                rename: Sequence[str | tuple[str, str]] = (), drop: Sequence[str] = (),
                dtype: str | None = None) -> RuleSet:
    """A rules file (if any) followed by the command-line rules."""
    base = load_rules_file(rules_file) if rules_file else RuleSet()
    pairs = tuple(parse_rename(r) if isinstance(r, str) else (r[0], r[1]) for r in rename)
    return base.then(RuleSet(tuple(strip_prefix), add_prefix or None, pairs, tuple(drop), dtype))


def check_target(spec: str, tensors: Sequence[OutTensor], target_tensors: Sequence[TensorMeta],
                 allow_missing: Sequence[str], lazy: Sequence[str] = ()) -> TargetCheck:
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
def migrate(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    to: str | None = None,
    key: str | None = None,
    rules: RuleSet | None = None,
    strip_prefix: Sequence[str] = (),
    add_prefix: str | None = None,
    rename: Sequence[str | tuple[str, str]] = (),
    drop: Sequence[str] = (),
    dtype: str | None = None,
    allow_overflow: bool = False,
    rules_file: str | None = None,
    target: str | None = None,
    target_kwargs: dict[str, Any] | None = None,
    auto: bool = False,
    allow_missing: Sequence[str] = (),
    devices: Sequence[str] | None = None,
    max_shard_size: int | str | None = None,
    workers: int | None = None,
    state_dict_only: bool = False,
    sanitize: bool = False,
    force: bool = False,
    dry_run: bool = False,
    verify: bool = True,
    unsafe: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    progress: Progress | None = None,
    on_rules: Callable[[RuleSet], None] | None = None,
    on_cleaned: Callable[[staletemp.CleanReport], None] | None = None,
    _after_write: Callable[[str], None] | None = None,
) -> MigrateReport:
    """Rewrite SRC's keys (and format, and dtype) into OUT; see the module docstring.

    ``rules`` replaces the individual rule options when given. ``on_rules``
    is called with rules inferred by ``auto`` before they are applied.
    ``on_cleaned`` is called as soon as stale temporaries of killed runs were
    removed from OUT's folder (or failed to be), whatever happens next.
    ``_after_write`` (tests only) sees the temporary output before it is verified.
    ``sanitize`` rewrites the metadata of a torch output into types
    ``torch.load(weights_only=True)`` accepts (writers/torchsave/sanitize.py) and proves
    the output loads that way in a fresh process; without it, objects read
    as placeholders are written back exactly as they were.
    ``allow_overflow`` writes an output even when a cast turned finite values
    into inf/NaN (the counts are in the report); without it that fails, and
    nothing is published.
    ``workers`` (default: the cores, for DeepSpeed/DCP sources) write a safetensors or sharded output from
    several processes; under ``torchrun`` every rank writes its share (commands/migrate/parallel/workers.py).
    """
    from ...writers.safetensors.sharded import parse_size

    src = os.fspath(src)
    out = os.fspath(out) if out is not None else None
    progress = progress or NoProgress()
    if out is None and not dry_run:
        raise UsageError("give the output path with -o OUT (or --dry-run to only print the plan)")
    if auto and not target:
        raise UsageError("--auto infers rules from a target: give --target SPEC too")
    shard_bytes = parse_size(str(max_shard_size)) if max_shard_size not in (None, "") else None
    fmt = writers.choose_format(out, to, shard_bytes)
    if sanitize and fmt != writers.TORCH_ZIP:
        raise UsageError("--sanitize rewrites the metadata of a torch (.pth) output; a safetensors or DCP output "
                         "holds no pickled metadata, so it needs none")
    if rules is None:
        rules = build_rules(rules_file=rules_file, strip_prefix=strip_prefix, add_prefix=add_prefix,
                            rename=rename, drop=drop, dtype=dtype)
    from .parallel.torchrun import Dist

    dist = None if dry_run else Dist.from_env()
    ck = load(src, key=key, unsafe=unsafe, limits=limits, read_values=True)  # a DCP folder's non-tensor values
    try:
        return _migrate(ck, src, out, fmt, rules, target=target, target_kwargs=target_kwargs, auto=auto,
                        allow_missing=tuple(allow_missing), devices=devices, shard_bytes=shard_bytes,
                        state_dict_only=state_dict_only, sanitize=sanitize, force=force, dry_run=dry_run,
                        verify=verify,
                        limits=limits, progress=progress, on_rules=on_rules, on_cleaned=on_cleaned,
                        after_write=_after_write, parallel=(workers, dist, key, unsafe),
                        allow_overflow=allow_overflow)
    finally:
        ck.close()


def _migrate(ck: Checkpoint, src: str, out: str | None, fmt: str, rules: RuleSet, *, target: str | None,
             target_kwargs: dict[str, Any] | None, auto: bool, allow_missing: tuple[str, ...],
             devices: Sequence[str] | None, shard_bytes: int | None, state_dict_only: bool, sanitize: bool,
             force: bool,
             dry_run: bool, verify: bool, limits: Limits, progress: Progress,
             on_rules: Callable[[RuleSet], None] | None, on_cleaned: Callable[[staletemp.CleanReport], None] | None,
             after_write: Callable[[str], None] | None, parallel: tuple[Any, ...] = (None, None, None, False),
             allow_overflow: bool = False) -> MigrateReport:
    # ties are handled (kept, or stored once with aliases) and reported by migrate itself
    warnings = [w for w in ck.warnings if not _SHARED_NOTE.match(w)]
    if not ck.tensors:
        raise UsageError("the source holds no tensors to migrate (use --key to pick the state_dict)", src)
    # 1. rules, inferred ones first
    built = None
    inferred = None
    if target:
        from ...tensors.target import build_target

        built = build_target(target, target_kwargs)
        warnings += [f"target: {w}" for w in built.warnings]
        if auto:
            from ...keys.infer import suggest

            pre = make_plan(ck.tensors, rules)
            renamed_view = [TensorMeta(e.output, t.dtype, t.shape) for e, t in zip(pre.entries, ck.tensors)
                            if e.output is not None]
            found = suggest(renamed_view, built.tensors, lazy=built.lazy)
            if found is not None:
                inferred = found.rules
                rules = rules.then(inferred) if not rules.is_empty else inferred
                if on_rules is not None:
                    on_rules(inferred)
            else:
                inferred = RuleSet()
                if on_rules is not None:
                    on_rules(inferred)
    # 2. the plan; every conflict raises here, before anything is written
    plan = make_plan(ck.tensors, rules)
    plan, kept_dtype = keep_packed_dtypes(plan)
    if kept_dtype:
        warnings.append(f"not cast: {len(kept_dtype)} tensor(s) inside quantized layers' packed params keep their "
                        f"dtype, which the quantized kernels require ({', '.join(kept_dtype[:3])})")
    by_key = ck.by_key
    tensors = tuple(OutTensor(e.output, by_key[e.source], e.cast or e.dtype) for e in plan.entries
                    if e.output is not None)
    if not tensors:
        raise UsageError("the rules drop every tensor; nothing would be written")
    for t in tensors:
        require_data(t)
    quantized = [t.key for t in tensors if dtypes.lookup(t.dtype).is_quantized]
    if quantized and fmt != writers.TORCH_ZIP:
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
    check = None
    if built is not None:
        check = check_target(target or "", tensors, built.tensors, allow_missing, built.lazy)
    report_args: dict[str, Any] = dict(source=src, output=out, format=fmt, source_format=ck.format, plan=plan,
                                       tensors=tensors, rules=rules, inferred=inferred, target=check)
    # 3. the output's shape: container, metadata, ties
    chosen = resolve_key(ck.root, ck.state_dict_key or "", src) if ck.state_dict_key else ck.root
    if built is not None and built.extra_state and isinstance(chosen, Mapping):
        opaque = [k for k, v in chosen.items() if isinstance(v, Placeholder) and rules.new_key(str(k))
                  in built.extra_state]
        if opaque:
            raise UsageError(f"--target cannot load {', '.join(map(repr, opaque[:3]))}: "
                             f"{chosen[opaque[0]].qualname} "
                             "objects are read as inert placeholders and never rebuilt (ckpt runs no code from "
                             "the file), so the target check cannot hand them to the module; migrate without "
                             "--target, and load the output with torch.load(weights_only=False) only if you "
                             "trust the file")
    payload: dict[str, Any] = {}
    held = [k for k in entries_holding_tensors(chosen, ck.keys) if rules.new_key(k) is not None] \
        if fmt != writers.TORCH_ZIP else []
    if held:  # never dropped silently: they are tensors of the source too
        raise UsageError(f"a {fmt} output holds a flat mapping of tensors; these state_dict entries hold tensors "
                         f"inside another object and would be lost: {', '.join(map(repr, held[:5]))}"
                         f"{' ...' if len(held) > 5 else ''}; write a .pth, or leave them out with --drop")
    if fmt == writers.TORCH_ZIP:
        root, sd_key, kept, more = torch_root(ck, chosen, tensors, rules, state_dict_only)
        warnings += more
        from ...writers.torchsave.inert import refuse_unwritable

        refuse_unwritable(root, src, sd_key)  # dangerous references are never written back, not even sanitized
        if sanitize:
            from ...pickles.weights_only.predict import rules_for
            from ...writers.torchsave.sanitize import sanitize as sanitize_tree

            root, conversions = sanitize_tree(root, rules_for(None).allowed)
            report_args["sanitized"] = tuple(conversions)
        from ...writers.torchsave.archive import pickle_root

        payload.update(pickle=pickle_root(root), root=root, sd_key=sd_key)
        report_args["metadata_kept"] = tuple(kept)
    elif fmt in (writers.SAFETENSORS, writers.SHARDED):
        stored, aliases, more = dedupe(tensors)
        warnings += more
        meta, kept, more = safetensors_metadata(ck, chosen, state_dict_only)
        warnings += more
        clash = sorted(a for a in aliases if a in meta)
        if clash:
            warnings.append(f"metadata entries replaced by tie records: {', '.join(clash[:5])}")
        from ...writers.safetensors.single import check_dtypes

        check_dtypes(stored)
        payload.update(stored=stored, aliases=aliases, meta=meta)
        report_args.update(metadata_kept=tuple(kept), aliases=aliases)
    else:
        if not state_dict_only and ck.layout == "container":
            warnings.append("a DCP output holds the state_dict only; the other entries were not kept")
    # 4. where it goes, and on which devices it will be proven
    run_devices, status = _devices(verify and not dry_run, devices)
    if check is not None and not check.ok:
        return MigrateReport(**report_args, dry_run=dry_run, device_status=status, warnings=tuple(warnings))
    if dry_run:
        if out is not None and os.path.lexists(out):
            warnings.append(f"{out} exists{'' if force else '; the real run needs --force'}")
        return MigrateReport(**report_args, dry_run=True, device_status=status, warnings=tuple(warnings))
    if out is None:
        raise UsageError("give the output path with -o OUT")
    from .parallel.workers import PARALLEL_FORMATS, choose_workers

    workers, dist, key, unsafe = parallel
    if dist is not None and not dist.leader and fmt not in PARALLEL_FORMATS:
        return MigrateReport(**report_args, device_status=status,
                             warnings=(f"rank {dist.rank}: a {fmt} output is one file, written by rank 0",))
    folder = fmt in writers.FOLDER_FORMATS
    destination.check_destination(out, _source_paths(src, ck), force=force, folder=folder)
    if folder and force:
        from ...writers.dcp import DCP_SUFFIXES
        from ...writers.safetensors.sharded import SHARD_SUFFIXES

        destination.check_replaceable_folder(out, SHARD_SUFFIXES if fmt == writers.SHARDED else DCP_SUFFIXES)
    # 5. room for it: stale temporaries of killed runs go first, then the free space must hold every file
    report_args["cleaned"] = _clean_stale(out, on_cleaned, warnings) if dist is None or dist.leader else ()
    from ...writers.sizes import planned_sizes, quick_bound

    freespace.require(out, lambda: planned_sizes(fmt, out, tensors, payload, shard_bytes),  # --force does not skip it
                      quick_bound(fmt, out, tensors, payload, shard_bytes))
    job = Job(out, fmt, tensors, payload, shard_bytes, run_devices, status, target, target_kwargs,
               allow_missing, verify, limits, progress, after_write, report_args, warnings, force,
               choose_workers(workers, ck.format, fmt, sum(t.nbytes for t in tensors)),
               dist if fmt in PARALLEL_FORMATS else None, (src, key, unsafe), allow_overflow)
    # 6. write, verify, publish
    with interrupts.interrupts_as_exceptions():
        return write_and_publish(job)


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
    if not active:
        return [], {}
    from .verify.devices import resolve_devices

    return resolve_devices(devices)
