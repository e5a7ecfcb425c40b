"""ckpt diff A [B | --target SPEC]"""
from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import EXIT_FINDING, EXIT_OK
from ..render.common import dumps
from . import keep_until_exit
from .options import (
    json_option,
    key_option,
    limit_options,
    limits_from,
    quiet_option,
    target_kwargs_from,
    torch_version_option,
    unsafe_option,
)
from .remote_io import download_option, remote_scope, transfer_bar, verbose_option


@click.command("diff")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path(), required=False)
@click.option("--target", default=None, metavar="SPEC",
              help="Compare with a module instead of B: 'package.module:Name' or 'path/to/file.py:Name' "
                   "(an nn.Module class, a factory function or an instance), built on the meta device.")
@click.option("--target-kwargs", default=None, metavar="JSON",
              help="Keyword arguments for the target's constructor, as a JSON object (or @file.json).")
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
    from ..commands.diff.diff import diff

    kw = target_kwargs_from(target_kwargs)
    if kw and target is None:
        from ..errors import UsageError

        raise UsageError("--target-kwargs needs --target")
    bars: list[Any] = []
    show_bar = values and not quiet and not as_json and sys.stderr.isatty() and not transfer_bar([a, b], quiet)

    def start(total: int) -> None:
        bars.append(click.progressbar(length=total, label="comparing values", file=sys.stderr))

    with remote_scope([a, b], download=download, verbose=verbose, quiet=quiet):
        report = diff(a, b, target=target, target_kwargs=kw, key=key, key_b=key_b, unsafe=unsafe, values=values,
                      atol=atol, rtol=rtol, fail_on_metadata=fail_on_metadata, limits=limits_from(kwargs),
                      progress=(lambda _key: bars[0].update(1)) if show_bar else None,
                      on_start=start if show_bar else None, torch_version=torch_version)
    keep_until_exit(report)
    for bar in bars:
        bar.render_finish()
    from ..render.diff import render, verdict

    if as_json:
        click.echo(dumps(report.to_json()))
    elif quiet:
        click.echo(verdict(report))
    else:
        click.echo(render(report))
    return EXIT_OK if report.equal else EXIT_FINDING


COMMANDS = [diff_command]
