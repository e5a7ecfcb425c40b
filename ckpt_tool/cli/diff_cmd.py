"""ckpt diff A [B | --target SPEC]"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from ..format_names import DiffMetric
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
    torch_version_option,
    tp_rules_option,
    unsafe_option,
)
from .progress import progress_bars
from .remote_io import download_option, remote_scope, verbose_option

if TYPE_CHECKING:
    from ..formats import SourceOptions
from .report_exit import exit_code


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
@key_rule_options
@click.option("--auto", is_flag=True,
              help="Infer the key rewrite that makes A's keys match B's (or the --target's) and apply it to A "
                   "before comparing, after the rules above.")
@click.option("--sort", type=click.Choice([m.value for m in DiffMetric]), default=None,
              help="With --values: list tensors (and rollups) by this figure, largest change first "
                   "(cosine: lowest first; key: alphabetical). Default: A's order.")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --values: keep only the first N tensors (after --sort) in the table and JSON `values`.")
@click.option("--rollup-depth", type=click.IntRange(min=0), default=None, metavar="N",
              help="With --values: also sum the figures per module, keys cut to their first N dotted parts "
                   "(0: the whole model).")
@click.option("--rollup-layers", is_flag=True,
              help="With --values: also sum the figures with layer indices folded (layers.*.attn.q.weight); "
                   "with --rollup-depth, folded first.")
@click.option("--csv", "csv_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --values: write the per-tensor table as CSV (every figure, in --sort order, cut to --top).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --values: write a self-contained HTML report (verdict, fix, heatmap, sortable table, "
                   "histograms of the top tensors).")
@torch_version_option
@tp_rules_option
@download_option
@verbose_option
@limit_options
@source_options
def diff_command(a: str, b: str | None, source: SourceOptions, target: str | None, target_kwargs: str | None,
                 as_json: bool, key_b: str | None, quiet: bool, values: bool, atol: float, rtol: float,
                 fail_on_metadata: bool, strip_prefix: tuple[str, ...], add_prefix: str | None,
                 rename: tuple[str, ...], auto: bool, sort: str | None, top: int | None, rollup_depth: int | None,
                 rollup_layers: bool, csv_file: str | None, html_file: str | None, verbose: bool) -> int:
    """What happens if A's weights are loaded where B (or the --target module) is expected.

    Reports missing, unexpected, shape- and dtype-mismatched keys the way
    load_state_dict does, metadata differences, and (with --values) how far
    the values are apart; prints the `ckpt migrate` command that fixes key
    prefixes and renames. --strip-prefix, --add-prefix, --rename and --auto
    rewrite A's keys before comparing, exactly as migrate would. Exit code: 0
    no differences (without --values: in keys, shapes and dtypes), 1
    differences, 2 error.
    """
    from ..commands.diff import DiffHooks, DiffOptions, ValueView, diff_plan, run_diff
    from ..keys import RuleSet, parse_rename

    kw = target_kwargs_for(target, target_kwargs)
    if (csv_file or html_file) and not values:
        raise UsageError("--csv and --html write the --values figures: add --values")
    if csv_file and html_file and os.path.abspath(csv_file) == os.path.abspath(html_file):
        raise UsageError("--csv and --html name the same file: give each its own")
    for report_file in (csv_file, html_file):
        if report_file:  # before the comparison: never over an input, never into a folder that is not there
            from ..io.atomic import check_destination

            check_destination(report_file, [a, b or ""], force=True, folder=False)
    # the RuleSet migrate builds from the same options (commands/migrate/plan.py build_rules)
    rules = RuleSet(tuple(strip_prefix), add_prefix or None, tuple(parse_rename(r) for r in rename))
    view = ValueView(sort=DiffMetric(sort) if sort else None, top=top, rollup_depth=rollup_depth,
                     rollup_layers=rollup_layers, histograms=HTML_HISTOGRAMS if html_file else 0)
    options = DiffOptions(target=target, target_kwargs=kw, key_b=key_b, values=values, atol=atol, rtol=rtol,
                          fail_on_metadata=fail_on_metadata, rules=rules, auto=auto, view=view)
    bars = progress_bars(quiet=quiet or as_json, paths=[a, b])
    try:
        with remote_scope([a, b], download=source.download, verbose=verbose, quiet=quiet):
            report = run_diff(diff_plan(a, b, source, options), DiffHooks(bars))
    finally:
        bars.done()
    keep_until_exit(report)
    from ..render import diff_text as render, verdict, write_csv

    if csv_file:
        write_csv(report, csv_file)
    if html_file:
        from ..render.html import write_html

        write_html(report, html_file)
    if as_json:
        click.echo(dumps(report.to_json()))
    elif quiet:
        click.echo(verdict(report))
    else:
        click.echo(render(report))
    return exit_code(report)


HTML_HISTOGRAMS = 8  # tensors whose A, B and B-A histograms the HTML report shows

COMMANDS = [diff_command]
