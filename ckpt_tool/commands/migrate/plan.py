"""Migrate's plan: every option of ``migrate(...)`` turned once into frozen, typed parts.

The planner (``plan_migration``) checks the options against each other and
fixes the output format before the source is read; every later step reads
the plan it needs (source, rules, output, verification, parallelism) and
none re-parses an option. The parts a worker process needs (source, rules,
output) are frozen dataclasses, so they pickle across a process boundary.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ... import writers
from ...errors import UsageError
from ...format_names import OutputFormat
from ...formats.tp import TpRules, load_rules
from ...io.atomic import staletemp
from ...keys.rules import RuleSet, load_rules_file, parse_rename
from ...limits import DEFAULT_LIMITS, Limits
from ...progress import NO_PROGRESS, Progress
from .parallel.torchrun import Dist

if TYPE_CHECKING:
    from ...formats.hf.deploy import HfOutput


@dataclass(frozen=True, kw_only=True)
class SourcePlan:
    """How the source is read, by this process and again by each worker."""

    path: str
    key: str | None = None
    unsafe: bool = False
    limits: Limits = DEFAULT_LIMITS
    tp_rules: TpRules | None = None  # --tp-rules FILE: how a DeepSpeed run's tensor-parallel shards merge
    unstack_layers: bool = False  # a Megatron torch_dist source read with per-layer names (formats/megatron/)


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


def build_rules(*, rules_file: str | None = None, strip_prefix: Sequence[str] = (), add_prefix: str | None = None,
                rename: Sequence[str | tuple[str, str]] = (), drop: Sequence[str] = (),
                dtype: str | None = None) -> RuleSet:
    """A rules file (if any) followed by the command-line rules."""
    base = load_rules_file(rules_file) if rules_file else RuleSet()
    pairs = tuple(parse_rename(r) if isinstance(r, str) else (r[0], r[1]) for r in rename)
    return base.then(RuleSet(tuple(strip_prefix), add_prefix or None, pairs, tuple(drop), dtype))


def plan_migration(
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
    tp_rules: str | None = None,
    target: str | None = None,
    target_kwargs: Mapping[str, object] | None = None,
    auto: bool = False,
    allow_missing: Sequence[str] = (),
    devices: Sequence[str] | None = None,
    max_shard_size: int | str | None = None,
    workers: int | None = None,
    state_dict_only: bool = False,
    keep_container: bool = False,
    config_from: str | None = None,
    sanitize: bool = False,
    force: bool = False,
    dry_run: bool = False,
    verify: bool = True,
    unsafe: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    unstack_layers: bool = False,
) -> MigratePlan:
    """The plan of ``migrate(...)``'s keyword arguments; a usage error raises here, before anything is read."""
    out_path = os.fspath(out) if out is not None else None
    if out_path is None and not dry_run:
        raise UsageError("give the output path with -o OUT (or --dry-run to only print the plan)")
    if auto and not target:
        raise UsageError("--auto infers rules from a target: give --target SPEC too")
    shard_bytes = None
    if max_shard_size not in (None, ""):
        from ...writers.safetensors.sharded import parse_size

        shard_bytes = parse_size(str(max_shard_size))
    fmt = writers.choose_format(out_path, to, shard_bytes)
    if sanitize and fmt is not OutputFormat.TORCH_ZIP:
        raise UsageError("--sanitize rewrites the metadata of a torch (.pth) output; a safetensors or DCP output "
                         "holds no pickled metadata, so it needs none")
    hf = None
    if fmt is OutputFormat.HF_FOLDER:
        from ...formats.hf.deploy import plan_hf_output

        hf = plan_hf_output(os.fspath(src), config_from)
        if shard_bytes and not hf.shardable:
            raise UsageError("PEFT loads an adapter from one adapter_model.safetensors, never a sharded set: "
                             "drop --max-shard-size")
        if keep_container:
            raise UsageError("a Hugging Face folder holds the weights alone: --keep-container cannot apply")
        state_dict_only = True  # a model folder holds weights; the training state is left behind
    elif config_from is not None:
        raise UsageError("--config-from copies a model's config and tokenizer files into a Hugging Face folder: "
                         "give --to hf too")
    if keep_container and state_dict_only:
        raise UsageError("--keep-container and --state-dict-only contradict each other: give one")
    # --key selects the state_dict to write (CONTRACT: "select (--key)"): the output is that sub-dict alone,
    # unless --keep-container writes it back into the rest of the container
    state_dict_only = state_dict_only or (key is not None and not keep_container)
    if rules is None:
        rules = build_rules(rules_file=rules_file, strip_prefix=strip_prefix, add_prefix=add_prefix,
                            rename=rename, drop=drop, dtype=dtype)
    return MigratePlan(
        source=SourcePlan(path=os.fspath(src), key=key, unsafe=unsafe, limits=limits,
                          tp_rules=load_rules(tp_rules) if tp_rules else None, unstack_layers=unstack_layers),
        rules=rules,
        output=OutputPlan(path=out_path, format=fmt, shard_bytes=shard_bytes, state_dict_only=state_dict_only,
                          sanitize=sanitize, force=force, dry_run=dry_run, hf=hf),
        verification=VerificationPlan(enabled=verify, devices=tuple(devices) if devices is not None else None,
                                      target=target, target_kwargs=target_kwargs, auto=auto,
                                      allow_missing=tuple(allow_missing), allow_overflow=allow_overflow),
        parallelism=ParallelPlan(workers=workers, dist=None if dry_run else Dist.from_env()),
    )
