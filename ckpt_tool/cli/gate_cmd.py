"""ckpt gate PATH... [--target SPEC] [--policy FILE]"""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..render import dumps
from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    limit_options,
    quiet_option,
    sarif_option,
    source_options,
    target_kwargs_from,
    target_options,
    torch_version_option,
    tp_rules_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option
from .report_exit import exit_code

if TYPE_CHECKING:
    from ..formats import SourceOptions


@click.command("gate")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--policy", "policy_file", type=click.Path(), default=None, metavar="FILE",
              help="A TOML policy (docs/ci.md); the options below override it.")
@target_options("The module the checkpoint must load into strictly")
@key_option
@click.option("--strict/--no-strict", default=None,
              help="Also fail on suspicious classes and on every warning inspect would print.")
@click.option("--nan-check/--no-nan-check", default=None, help="Read the data and fail on NaN/Inf (default: on).")
@click.option("--allow-dtype", "allow_dtypes", multiple=True, metavar="DTYPE",
              help="A dtype floating tensors may have (repeatable), e.g. --allow-dtype bf16 --allow-dtype fp32.")
@click.option("--max-size", default=None, metavar="SIZE", help="Largest file (or folder) size, e.g. '2 GiB'.")
@click.option("--require-metadata", "required", multiple=True, metavar="KEY",
              help="A metadata key that must be present (repeatable; dotted paths like args.lr).")
@click.option("--sha256", default=None, metavar="HEX", help="The file's expected sha256 (one PATH).")
@click.option("--weights-only-check/--no-weights-only-check", "weights_only_check", default=None,
              help="Fail when the deployment's default torch.load (weights_only=True) would refuse the file "
                   "(default: on).")
@click.option("--allow-global", "allow_globals", multiple=True, metavar="MODULE.NAME",
              help="A global the deployment's loader allowlists with torch.serialization.safe_globals "
                   "(repeatable), e.g. argparse.Namespace; never one that can run code.")
@click.option("--require-dtype/--no-require-dtype", "require_dtype", default=None,
              help="Fail when a tensor's dtype differs from the target's (default: a warning, since "
                   "load_state_dict casts; --strict fails on it too).")
@click.option("--skip", "skip", multiple=True, metavar="CHECK",
              help="A check not to run (repeatable), e.g. --skip sha256; never loads-safely.")
@torch_version_option
@tp_rules_option
@click.option("--junit", "junit_file", type=click.Path(), default=None, metavar="FILE",
              help="Also write a JUnit XML report (one test case per check) for CI systems.")
@sarif_option
@json_option
@quiet_option
@download_option
@verbose_option
@limit_options
@source_options
def gate_command(paths: tuple[str, ...], source: SourceOptions, policy_file: str | None, target: str | None,
                 target_kwargs: str | None, strict: bool | None, nan_check: bool | None,
                 allow_dtypes: tuple[str, ...], max_size: str | None, required: tuple[str, ...], sha256: str | None,
                 weights_only_check: bool | None, allow_globals: tuple[str, ...], require_dtype: bool | None,
                 skip: tuple[str, ...], junit_file: str | None, sarif_file: str | None, as_json: bool, quiet: bool,
                 verbose: bool) -> int:
    """The pre-deploy checks for CI, each reported pass/fail with its detail.

    loads-safely (no dangerous pickle content), weights-only (the deployment's
    default torch.load, weights_only=True since torch 2.6, loads it), matches-target (strictly, with
    the fix command for key prefixes; a dtype difference is a warning unless --require-dtype),
    no-nan-inf (reads the data), dtype-policy, file-size, required-metadata, sha256 and warnings
    (fails with --strict). --allow-global lifts a global from every check it would fail.
    Exit code: 0 all passed, 1 a check failed (a dangerous file fails with 1
    even when it is also unreadable), 2 a file or folder could not be read.
    """
    from ..commands.gate import GateOptions, Policy, gate_paths, load_policy

    policy = load_policy(policy_file) if policy_file else Policy()
    options = GateOptions(
        target=target, target_kwargs=target_kwargs_from(target_kwargs), policy=policy, strict=strict,
        nan_check=nan_check,
        allowed_float_dtypes=allow_dtypes or None, max_file_size=max_size, required_metadata=required or None,
        sha256=sha256, weights_only_check=weights_only_check, allow_globals=allow_globals or None,
        require_dtype=require_dtype, skip=skip or None)
    bars = progress_bars(quiet=quiet or as_json, paths=paths)
    try:
        with remote_scope(paths, download=source.download, verbose=verbose, quiet=quiet):
            report = gate_paths(paths, source, options, bars)
    finally:
        bars.done()
    keep_until_exit(report)
    for f in report.files:
        if f.error:
            click.echo(f"ckpt: error: {f.error}", err=True)
    if junit_file:
        from ..render import write_junit

        write_junit(report, junit_file)
    if sarif_file:
        from ..render import gate_sarif, write_sarif

        write_sarif(gate_sarif(report), sarif_file)
    if as_json:
        click.echo(dumps(report.to_json()))
    else:
        from ..render import gate_text as render

        click.echo(render(report, quiet=quiet))
    return exit_code(report)


COMMANDS = [gate_command]
