"""ckpt migrate SRC -o OUT"""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..render import dumps
from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    key_rule_options,
    limit_options,
    quiet_option,
    source_options,
    target_kwargs_for,
    target_options,
    tp_rules_option,
    unsafe_option,
    unstack_layers_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option
from .report_exit import exit_code

if TYPE_CHECKING:
    from ..formats import SourceOptions
    from ..io.atomic import CleanReport
    from ..keys import RuleSet


@click.command("migrate")
@click.argument("src", type=click.Path())
@click.option("-o", "--output", "out", default=None, metavar="OUT",
              help="Output file (.pth/.pt/.bin, .safetensors) or folder (--max-shard-size, --to dcp, --to hf).")
@click.option("--to", type=click.Choice(["pth", "safetensors", "dcp", "hf"], case_sensitive=False), default=None,
              help="Output format (default: from OUT's extension). hf: a Hugging Face folder from_pretrained loads "
                   "(safetensors weights, with SRC's config and tokenizer files).")
@key_option
@key_rule_options
@click.option("--drop", multiple=True, metavar="GLOB", help="Leave out keys matching GLOB (repeatable).")
@click.option("--dtype", default=None, metavar="DTYPE", help="Cast floating tensors to DTYPE (bf16, fp16, fp32, ...).")
@click.option("--allow-overflow", is_flag=True,
              help="Write the output even when a cast turns finite values into inf/NaN (counted per tensor in the "
                   "report); without it such a cast fails and nothing is written.")
@click.option("--rules", "rules_file", default=None, metavar="FILE",
              help="A TOML rules file (applied before the options above; see docs/migrate.md).")
@tp_rules_option
@target_options("Module the output must load into with strict=True")
@click.option("--auto", is_flag=True, help="Infer the rules that make SRC match --target (printed before applying).")
@click.option("--allow-missing", multiple=True, metavar="GLOB",
              help="Target keys that may be missing from the output (a new head the model initialises).")
@click.option("--device", "devices", multiple=True, metavar="DEV",
              help="Verify on DEV (cpu, cuda, cuda:N; repeatable). Default: cpu and every available CUDA device.")
@click.option("--max-shard-size", default=None, metavar="SIZE",
              help="Write a sharded safetensors folder with shards of at most SIZE (5GB, 500MB, 2GiB).")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Processes writing a .safetensors or sharded output (default for consolidation sources: one "
                   "per 2 usable cores and 1 GiB of output, at most 8, else 1). Under torchrun each rank writes "
                   "its share instead.")
@click.option("--state-dict-only", is_flag=True, help="Write only the weights, not epoch/optimizer/args metadata.")
@click.option("--keep-container", is_flag=True,
              help="With --key: write the selected state_dict back inside the rest of the container (epoch, "
                   "optimizer, the other state_dicts); without it, --key writes that state_dict alone.")
@click.option("--config-from", default=None, metavar="DIR",
              help="With --to hf: copy the config and tokenizer files from DIR (a model's folder) instead of SRC.")
@click.option("--sanitize", is_flag=True,
              help="Rewrite the metadata into types torch.load(weights_only=True) accepts (Namespace -> dict, NumPy "
                   "-> numbers and tensors, enums -> values, other objects -> dicts) and prove the output loads "
                   "that way (torch files; lists each conversion).")
@click.option("--force", is_flag=True, help="Replace an existing OUT (only after the new one is written and verified).")
@click.option("--dry-run", is_flag=True, help="Print the plan (old key -> new key, dropped, cast); write nothing.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Re-read OUT and compare every tensor bit for bit (and load into --target).")
@unstack_layers_option
@unsafe_option
@json_option
@quiet_option
@download_option
@verbose_option
@limit_options
@source_options
def migrate_command(src: str, out: str | None, source: SourceOptions, to: str | None, strip_prefix: tuple[str, ...],
                    add_prefix: str | None, rename: tuple[str, ...], drop: tuple[str, ...], dtype: str | None,
                    allow_overflow: bool, rules_file: str | None, target: str | None, target_kwargs: str | None,
                    auto: bool, allow_missing: tuple[str, ...], devices: tuple[str, ...], max_shard_size: str | None,
                    workers: int | None, state_dict_only: bool, keep_container: bool, config_from: str | None,
                    sanitize: bool, force: bool, dry_run: bool, verify: bool, as_json: bool, quiet: bool,
                    verbose: bool) -> int:
    """Rewrite keys, format and dtype of SRC into OUT, atomically, and prove the result.

    Rules apply in this order: --key, --strip-prefix, --add-prefix, --rename,
    --drop, --dtype. Conflicts (two keys becoming one, an empty key, a cast of
    a non-floating tensor) stop before anything is written. OUT is written
    beside its final path, fsynced, verified and only then renamed into
    place; SRC is never modified. Stale temporaries that killed runs left in
    OUT's folder are removed first (said on stderr), and an output that would
    not fit in the free space is refused before anything is read. Exit code:
    0 written and verified (or a clean dry run), 1 verification or target
    check failed (nothing written), 2 error.
    """
    from ..commands.migrate import Hooks, MigrateOptions, run_migration
    from ..commands.migrate.parallel import follower
    from ..render import migrate_text as render

    if follower():  # a torchrun rank other than 0: rank 0 prints the one report
        quiet, as_json = True, False

    kw = target_kwargs_for(target, target_kwargs)

    def announce(rules: RuleSet) -> None:
        if not as_json and not quiet:
            text = rules.describe() if not rules.is_empty else "(none needed: the keys already match)"
            click.echo(f"inferred rules: {text}")

    def cleaned(found: CleanReport) -> None:
        from ..render import removed_line

        if found.removed and not quiet:
            click.echo(removed_line(found.removed), err=True)

    options = MigrateOptions(
        to=to, strip_prefix=strip_prefix, add_prefix=add_prefix, rename=rename, drop=drop, dtype=dtype,
        allow_overflow=allow_overflow, rules_file=rules_file, target=target, target_kwargs=kw, auto=auto,
        allow_missing=allow_missing, devices=devices or None, max_shard_size=max_shard_size, workers=workers,
        state_dict_only=state_dict_only, keep_container=keep_container, config_from=config_from, sanitize=sanitize,
        force=force, dry_run=dry_run, verify=verify)
    bars = progress_bars(quiet=quiet, label_width=12)  # remote_scope below draws no bar of its own
    try:
        with remote_scope([src], download=source.download, verbose=verbose, quiet=True):  # its own bars show progress
            hooks = Hooks(progress=bars, on_rules=announce, on_cleaned=cleaned)
            report = run_migration(src, out, source, options, hooks)
        keep_until_exit(report)
    finally:
        bars.done()  # a bar left open by an error is closed before the message
    if as_json:
        click.echo(dumps(report.to_json()))
    elif (not quiet or not report.ok) and not follower():
        click.echo(render(report))
    return exit_code(report)


COMMANDS = [migrate_command]
