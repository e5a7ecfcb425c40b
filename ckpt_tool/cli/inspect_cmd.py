"""ckpt inspect PATH"""
from __future__ import annotations

import sys

import click

from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    limit_options,
    limits_from,
    quiet_option,
    torch_version_option,
    unsafe_option,
)
from .remote_io import download_option, remote_scope, transfer_bar, verbose_option


@click.command("inspect")
@click.argument("path", type=click.Path())
@json_option
@key_option
@unsafe_option
@quiet_option
@click.option("--stats", is_flag=True, help="Read tensor data: min/max/mean/std and NaN/Inf counts.")
@click.option("--tree", is_flag=True, help="Group keys by module path with parameter counts.")
@torch_version_option
@download_option
@verbose_option
@limit_options
def inspect_command(path: str, as_json: bool, key: str | None, unsafe: bool, quiet: bool,
                    stats: bool, tree: bool, torch_version: str | None, download: bool, verbose: bool,
                    **kwargs: object) -> int:
    """Show what is in a checkpoint: keys, shapes, dtypes, layout, metadata.

    Reads no tensor data unless --stats is given.
    """
    from ..commands.inspect.inspect import inspect
    from ..render.inspect import json_text, render

    bars: list = []
    show_bar = stats and not quiet and sys.stderr.isatty() and not transfer_bar([path], quiet)

    def start(n: int) -> None:
        if show_bar:
            bars.append(click.progressbar(length=n, label="reading tensors", file=sys.stderr))

    with remote_scope([path], download=download, verbose=verbose, quiet=quiet):
        report = inspect(path, key=key, unsafe=unsafe, stats=stats, limits=limits_from(kwargs),
                         on_start=start, progress=lambda t: bars[0].update(1) if bars else None,
                         torch_version=torch_version)
    keep_until_exit(report)
    if bars:
        bars[0].render_finish()
    if as_json:
        click.echo(json_text(report))
    else:
        click.echo(render(report, tree=tree))
    return 0


COMMANDS = [inspect_command]
