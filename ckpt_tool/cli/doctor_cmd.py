"""ckpt doctor"""
from __future__ import annotations

import click

from ..render.common import dumps
from .options import json_option


@click.command("doctor")
@json_option
def doctor_command(as_json: bool) -> int:
    """Report python, torch and CUDA versions and devices, and run one real computation on each.

    The check to run before GPU verification (migrate --device cuda). Exit
    code: 0 every device computed correctly, 1 something failed.
    """
    from ..commands.doctor import run_doctor
    from ..render.doctor import render

    report = run_doctor()
    click.echo(dumps(report.to_json()) if as_json else render(report))
    return 0 if report.ok else 1


COMMANDS = [doctor_command]
