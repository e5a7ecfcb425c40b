"""ckpt inspect PATH"""
from __future__ import annotations

import click

from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    limit_options,
    limits_from,
    quiet_option,
    torch_version_option,
    tp_rules_option,
    unsafe_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option


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
@click.option("--unstack-layers", is_flag=True,
              help="A Megatron-core torch_dist checkpoint's layers (and MoE experts), saved stacked on a leading axis, "
                   "under Megatron's per-layer names (decoder.layers.0.mlp.linear_fc1.weight), as a model's "
                   "state_dict holds them. Default: off (the keys and shapes as saved).")
@download_option
@verbose_option
@limit_options
def inspect_command(path: str, as_json: bool, key: str | None, unsafe: bool, quiet: bool,
                    stats: bool, tree: bool, torch_version: str | None, tp_rules: str | None, unstack_layers: bool,
                    download: bool,
                    verbose: bool, **kwargs: object) -> int:
    """Show what is in a checkpoint: keys, shapes, dtypes, layout, metadata.

    Reads no tensor data unless --stats is given.
    """
    from ..commands.inspect.command import inspect
    from ..render.inspect import json_text, render

    bars = progress_bars(quiet=quiet, paths=[path])
    try:
        with remote_scope([path], download=download, verbose=verbose, quiet=quiet):
            report = inspect(path, key=key, unsafe=unsafe, stats=stats, limits=limits_from(kwargs), progress=bars,
                             torch_version=torch_version, tp_rules=tp_rules, unstack_layers=unstack_layers)
    finally:
        bars.done()
    keep_until_exit(report)
    if as_json:
        click.echo(json_text(report))
    else:
        click.echo(render(report, tree=tree))
    return 0


COMMANDS = [inspect_command]
