"""ckpt diff A [B | --target SPEC]"""
from __future__ import annotations

from typing import Any

import click

from ..render.common import dumps
from . import keep_until_exit
from .exit_codes import exit_code
from .options import (
    json_option,
    key_option,
    limit_options,
    limits_from,
    quiet_option,
    target_kwargs_for,
    target_options,
    torch_version_option,
    unsafe_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option


@click.command("diff")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path(), required=False)
@target_options("Compare with a module instead of B")
@json_option
@key_option
@click.option("--key-b", default=None, metavar="DOTTED.PATH",
              help="Where B's state_dict is, when it differs from --key.")
@unsafe_option
@quiet_option
@click.option("--values", is_flag=True, help="Also compare tensor data (two checkpoints), one tensor at a time.")
@click.option("--atol", type=float, default=1e-8, show_default=True, help="Absolute tolerance for --values.")
@click.option("--rtol", type=float, default=1e-5, show_default=True, help="Relative tolerance for --values (of |B|).")
@click.option("--fail-on-metadata", is_flag=True,
              help="Count metadata differences (epoch, optimizer, ...) as differences for the exit code.")
@torch_version_option
@download_option
@verbose_option
@limit_options
def diff_command(a: str, b: str | None, target: str | None, target_kwargs: str | None, as_json: bool,
                 key: str | None, key_b: str | None, unsafe: bool, quiet: bool, values: bool, atol: float,
                 rtol: float, fail_on_metadata: bool, torch_version: str | None, download: bool, verbose: bool,
                 **kwargs: Any) -> int:
    """What happens if A's weights are loaded where B (or the --target module) is expected.

    Reports missing, unexpected, shape- and dtype-mismatched keys the way
    load_state_dict does, metadata differences, and (with --values) how far
    the values are apart; prints the `ckpt migrate` command that fixes key
    prefixes and renames. Exit code: 0 no differences, 1 differences, 2 error.
    """
    from ..commands.diff.command import diff

    kw = target_kwargs_for(target, target_kwargs)
    bars = progress_bars(quiet=quiet or as_json, paths=[a, b])
    try:
        with remote_scope([a, b], download=download, verbose=verbose, quiet=quiet):
            report = diff(a, b, target=target, target_kwargs=kw, key=key, key_b=key_b, unsafe=unsafe,
                          values=values, atol=atol, rtol=rtol, fail_on_metadata=fail_on_metadata,
                          limits=limits_from(kwargs), progress=bars, torch_version=torch_version)
    finally:
        bars.done()
    keep_until_exit(report)
    from ..render.diff import render, verdict

    if as_json:
        click.echo(dumps(report.to_json()))
    elif quiet:
        click.echo(verdict(report))
    else:
        click.echo(render(report))
    return exit_code(report)


COMMANDS = [diff_command]
