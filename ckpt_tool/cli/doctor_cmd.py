"""ckpt doctor"""
from __future__ import annotations

import click

from ..errors import UsageError
from ..exit_codes import outcome_code
from ..render import dumps
from .options import json_option


@click.command("doctor")
@click.option("--clean", "clean_path", default=None, metavar="FOLDER",
              help="Instead of the environment report: find the temporary outputs killed runs left under FOLDER "
                   "(recursively) and remove those whose writer is gone.")
@click.option("--dry-run", is_flag=True, help="With --clean: list what would be removed; remove nothing.")
@json_option
def doctor_command(clean_path: str | None, dry_run: bool, as_json: bool) -> int:
    """Report python, torch and CUDA versions and devices, and run one real computation on each.

    The check to run before GPU verification (migrate --device cuda). Exit
    code: 0 every device computed correctly, 1 something failed.

    With --clean FOLDER: remove the hidden temporary outputs
    (.NAME.ckpt-tmp-*) that migrations killed with SIGKILL left under
    FOLDER. A temporary is removed only when its writer ran on this host and
    has exited, and no process holds its lock; the others are listed as
    kept. Exit code: 0 done, 1 a stale temporary could not be removed, 2
    FOLDER is not a folder.
    """
    if clean_path is not None:
        from ..commands.doctor import clean_temporaries
        from ..render import cleanup_text as render_clean

        found = clean_temporaries(clean_path, dry_run=dry_run)
        click.echo(dumps(found.to_json()) if as_json else render_clean(found))
        return outcome_code(failed=found.failed)
    if dry_run:
        raise UsageError("--dry-run goes with --clean FOLDER")
    from ..commands.doctor import run_doctor
    from ..render import doctor_text as render

    report = run_doctor()
    click.echo(dumps(report.to_json()) if as_json else render(report))
    return outcome_code(failed=not report.ok)


COMMANDS = [doctor_command]
