"""ckpt inspect PATH"""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    limit_options,
    quiet_option,
    source_options,
    torch_version_option,
    tp_rules_option,
    unsafe_option,
    unstack_layers_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option

if TYPE_CHECKING:
    from ..formats import SourceOptions


@click.command("inspect")
@click.argument("path", type=click.Path())
@json_option
@key_option
@unsafe_option
@quiet_option
@click.option("--stats", is_flag=True, help="Read tensor data: min/max/mean/std and NaN/Inf counts.")
@click.option("--tree", is_flag=True, help="Group keys by module path with parameter counts.")
@torch_version_option
@tp_rules_option
@unstack_layers_option
@download_option
@verbose_option
@limit_options
@source_options
def inspect_command(path: str, source: SourceOptions, as_json: bool, quiet: bool, stats: bool, tree: bool,
                    verbose: bool) -> int:
    """Show what is in a checkpoint: keys, shapes, dtypes, layout, metadata.

    Reads no tensor data unless --stats is given.
    """
    from ..commands.inspect import InspectOptions, inspect_input
    from ..render import inspect_text as render, json_text

    bars = progress_bars(quiet=quiet, paths=[path])
    try:
        with remote_scope([path], download=source.download, verbose=verbose, quiet=quiet):
            report = inspect_input(path, source, InspectOptions(stats=stats), bars)
    finally:
        bars.done()
    keep_until_exit(report)
    if as_json:
        click.echo(json_text(report))
    else:
        click.echo(render(report, tree=tree))
    return 0


COMMANDS = [inspect_command]
