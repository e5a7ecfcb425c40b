"""ckpt scan PATH..."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..render import dumps
from . import keep_until_exit, one_line
from .options import json_option, limit_options, quiet_option, sarif_option, source_options
from .remote_io import download_option, remote_scope
from .report_exit import exit_code

if TYPE_CHECKING:
    from ..formats import SourceOptions


@click.command("scan")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@json_option
@quiet_option
@click.option("--strict", is_flag=True, help="Also fail (exit 1) on suspicious files, not only dangerous ones.")
@click.option("-v", "--verbose", is_flag=True, help="List every global, safe ones too, and skipped files.")
@click.option("--skip-other", is_flag=True,
              help="Skip named files that hold no pickle, zip, NumPy or safetensors data instead of failing "
                   "(for hooks that pass every file).")
@click.option("--allow-global", "allow_globals", multiple=True, metavar="MODULE.NAME",
              help="Count this global as inert wherever it is called or constructed (repeatable), e.g. a class "
                   "the loading code trusts; never one that can run code by name (os.system).")
@sarif_option
@download_option
@limit_options
@source_options
def scan_command(paths: tuple[str, ...], source: SourceOptions, as_json: bool, quiet: bool, strict: bool,
                 verbose: bool, skip_other: bool, allow_globals: tuple[str, ...], sarif_file: str | None) -> int:
    """Statically scan every pickle in the inputs, without running any of it.

    Folders are scanned recursively. Each global a pickle imports gets a
    severity (safe, suspicious, dangerous) and each file a verdict. Exit
    code: 0 all safe (or suspicious without --strict), 1 dangerous content
    (with --strict also suspicious), 2 a file could not be read.
    """
    from ..commands.scan import ScanOptions, scan_paths

    options = ScanOptions(strict=strict, skip_other=skip_other, allow_globals=allow_globals)
    with remote_scope(paths, download=source.download, verbose=verbose, quiet=quiet):
        report = scan_paths(paths, source, options)
    keep_until_exit(report)
    for f in report.files:
        for e in f.errors:
            click.echo(f"ckpt: error: {one_line(str(e))}", err=True)
    if sarif_file:
        from ..render import scan_sarif, write_sarif

        write_sarif(scan_sarif(report), sarif_file)
    if as_json:
        click.echo(dumps(report.to_json()))
    else:
        from ..render import scan_text as render

        click.echo(render(report, verbose=verbose, quiet=quiet))
    return exit_code(report)


COMMANDS = [scan_command]
