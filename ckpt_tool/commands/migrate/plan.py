"""Migrate's plan: the SourceOptions and MigrateOptions turned once into frozen, typed parts.

The planner (``plan_migration``) checks the options against each other and
fixes the output format before the source is read; every later step reads
the plan it needs (source, rules, output, verification, parallelism) and
none re-parses an option. The parts a worker process needs (source, rules,
output) are frozen dataclasses, so they pickle across a process boundary.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from ... import writers
from ...errors import UsageError
from ...format_names import OutputFormat
from ...formats import SourceOptions
from ...io.atomic import staletemp
from ...keys import RuleSet, load_rules_file, parse_rename
from ...progress import NO_PROGRESS, Progress
from .parallel import Dist

if TYPE_CHECKING:
    from ...formats.hf import HfOutput


@dataclass(frozen=True, kw_only=True)
class SourcePlan(SourceOptions):
    """How the source is read, by this process and again by each worker: the SourceOptions and the path."""

    path: str

    @classmethod
    def of(cls, path: str | os.PathLike[str], source: SourceOptions) -> SourcePlan:
        return cls(path=os.fspath(path), **{f.name: getattr(source, f.name) for f in fields(SourceOptions)})


@dataclass(frozen=True, kw_only=True)
class MigrateOptions:
    """migrate's own options, as the caller gave them (how the source is read is the SourceOptions beside them).

    ``rules`` replaces the individual rule options (``rules_file`` to ``dtype``) when given.
    """

    to: str | None = None  # the output format (default: from OUT's extension)
    rules: RuleSet | None = None
    rules_file: str | None = None
    strip_prefix: Sequence[str] = ()
    add_prefix: str | None = None
    rename: Sequence[str | tuple[str, str]] = ()
    drop: Sequence[str] = ()
    dtype: str | None = None
    allow_overflow: bool = False
    target: str | None = None
    target_kwargs: Mapping[str, object] | None = None
    auto: bool = False
    allow_missing: Sequence[str] = ()
    devices: Sequence[str] | None = None
    max_shard_size: int | str | None = None
    workers: int | None = None
    state_dict_only: bool = False
    keep_container: bool = False
    config_from: str | None = None
    sanitize: bool = False
    force: bool = False
    dry_run: bool = False
    verify: bool = True


@dataclass(frozen=True, kw_only=True)
class OutputPlan:
    """Where the output goes and what it is; ``path`` is None only for a dry run."""

    path: str | None
    format: OutputFormat
    shard_bytes: int | None = None
    state_dict_only: bool = False
    sanitize: bool = False
    force: bool = False
    dry_run: bool = False
    hf: HfOutput | None = None  # a Hugging Face folder: the weights' names and the files copied beside them

    @property
    def folder(self) -> bool:
        return self.format in writers.FOLDER_FORMATS

    @property
    def weights_format(self) -> OutputFormat:
        """The format of the tensors' files (a Hugging Face folder's are safetensors, sharded or not)."""
        if self.format is OutputFormat.HF_FOLDER:
            return OutputFormat.SHARDED if self.shard_bytes else OutputFormat.SAFETENSORS
        return self.format


@dataclass(frozen=True, kw_only=True)
class VerificationPlan:
    """What the written output must prove before it is published."""

    enabled: bool = True
    devices: tuple[str, ...] | None = None  # as asked; None: cpu and every CUDA device here
    target: str | None = None
    target_kwargs: Mapping[str, object] | None = None
    auto: bool = False  # infer the rules that make the source match ``target``
    allow_missing: tuple[str, ...] = ()
    allow_overflow: bool = False


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """Processes writing the output: ``--workers`` as asked, and this rank's place under torchrun."""

    workers: int | None = None
    dist: Dist | None = None


@dataclass(frozen=True, kw_only=True)
class MigratePlan:
    """One migration, decided before the source is read (the rules may grow by ``--auto`` later)."""

    source: SourcePlan
    rules: RuleSet
    output: OutputPlan
    verification: VerificationPlan = field(default_factory=VerificationPlan)
    parallelism: ParallelPlan = field(default_factory=ParallelPlan)


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """The caller's callbacks: progress, rules inferred by --auto, stale temporaries removed, and (tests
    only) the temporary output before it is verified. They never cross a process boundary."""

    progress: Progress = NO_PROGRESS
    on_rules: Callable[[RuleSet], None] | None = None
    on_cleaned: Callable[[staletemp.CleanReport], None] | None = None
    after_write: Callable[[str], None] | None = None


NO_HOOKS = Hooks()


def build_rules(options: MigrateOptions) -> RuleSet:
    """``options.rules``, else a rules file (if any) followed by the command-line rules."""
    if options.rules is not None:
        return options.rules
    base = load_rules_file(options.rules_file) if options.rules_file else RuleSet()
    pairs = tuple(parse_rename(r) if isinstance(r, str) else (r[0], r[1]) for r in options.rename)
    return base.then(RuleSet(tuple(options.strip_prefix), options.add_prefix or None, pairs, tuple(options.drop),
                             options.dtype))


def plan_migration(src: str | os.PathLike[str], out: str | os.PathLike[str] | None,
                   source: SourceOptions, options: MigrateOptions) -> MigratePlan:
    """The plan of one migration; a usage error raises here, before anything is read."""
    out_path = os.fspath(out) if out is not None else None
    o = options
    if out_path is None and not o.dry_run:
        raise UsageError("give the output path with -o OUT (or --dry-run to only print the plan)")
    if o.auto and not o.target:
        raise UsageError("--auto infers rules from a target: give --target SPEC too")
    output = _output_plan(os.fspath(src), out_path, source, o)  # its usage errors before the rules file's
    return MigratePlan(
        source=SourcePlan.of(src, source),
        rules=build_rules(o),
        output=output,
        verification=VerificationPlan(enabled=o.verify, devices=tuple(o.devices) if o.devices is not None else None,
                                      target=o.target, target_kwargs=o.target_kwargs, auto=o.auto,
                                      allow_missing=tuple(o.allow_missing), allow_overflow=o.allow_overflow),
        parallelism=ParallelPlan(workers=o.workers, dist=None if o.dry_run else Dist.from_env()),
    )


def _output_plan(src: str, out_path: str | None, source: SourceOptions, o: MigrateOptions) -> OutputPlan:
    """Where the output goes and what it is, the options checked against each other."""
    shard_bytes = None
    if o.max_shard_size not in (None, ""):
        from ...writers.safetensors import parse_size

        shard_bytes = parse_size(str(o.max_shard_size))
    fmt = writers.choose_format(out_path, o.to, shard_bytes)
    if o.sanitize and fmt is not OutputFormat.TORCH_ZIP:
        raise UsageError("--sanitize rewrites the metadata of a torch (.pth) output; a safetensors or DCP output "
                         "holds no pickled metadata, so it needs none")
    hf = None
    state_dict_only = o.state_dict_only
    if fmt is OutputFormat.HF_FOLDER:
        from ...formats.hf import plan_hf_output

        hf = plan_hf_output(src, o.config_from)
        if shard_bytes and not hf.shardable:
            raise UsageError("PEFT loads an adapter from one adapter_model.safetensors, never a sharded set: "
                             "drop --max-shard-size")
        if o.keep_container:
            raise UsageError("a Hugging Face folder holds the weights alone: --keep-container cannot apply")
        state_dict_only = True  # a model folder holds weights; the training state is left behind
    elif o.config_from is not None:
        raise UsageError("--config-from copies a model's config and tokenizer files into a Hugging Face folder: "
                         "give --to hf too")
    if o.keep_container and state_dict_only:
        raise UsageError("--keep-container and --state-dict-only contradict each other: give one")
    # --key selects the state_dict to write (CONTRACT: "select (--key)"): the output is that sub-dict alone,
    # unless --keep-container writes it back into the rest of the container
    state_dict_only = state_dict_only or (source.key is not None and not o.keep_container)
    return OutputPlan(path=out_path, format=fmt, shard_bytes=shard_bytes, state_dict_only=state_dict_only,
                      sanitize=o.sanitize, force=o.force, dry_run=o.dry_run, hf=hf)
