"""The command line: parse, call the core, render, map errors to exit codes.

Errors become one line on stderr in exactly one place (``main``); ``--debug``
(or CKPT_DEBUG=1) shows the traceback instead.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

import click

from ..errors import EXIT_ERROR, CkptError
from ..version import __version__

_DEBUG = {"on": False}
# As the program (run()), commands keep their results alive until the process
# ends, which then ends with os._exit (_exit): see _run for the figures.
EXITING_FAST = {"on": False}
_KEPT: list[object] = []


def keep_until_exit(obj: object) -> None:
    """Let ``obj`` die with the process instead of being freed object by object (run() only).

    Worth it only with _exit: a kept result torn down by a normal exit costs
    more than freeing it at once (measured: 1.82 s vs 1.49 s CPU, inspect --json of
    200,000 tensors).
    """
    if EXITING_FAST["on"]:
        _KEPT.append(obj)


# cli/<name>_cmd.py modules, each registering the commands in its COMMANDS list
_MODULES = ("inspect", "diff", "migrate", "gate", "scan", "doctor")


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs (help imports them all).

    Each command module imports its part of the core: `ckpt inspect` answers
    in a fraction of a second and should not pay for migrate's imports.
    """

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            _register(cmd_name if cmd_name in _MODULES else None)
            if cmd_name not in self.commands:
                _register()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _register()
        return super().list_commands(ctx)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="ckpt")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Inspect, diff, migrate, gate and scan PyTorch checkpoints, safely.

    No command runs code from a checkpoint unless --unsafe is given.
    """
    if debug:
        _DEBUG["on"] = True


def _register(only: str | None = None) -> None:
    """Add the commands of one command module (or of all of them) to the group."""
    import importlib

    for name in _MODULES if only is None else (only,):
        module = importlib.import_module(f"{__name__}.{name}_cmd")
        for command in getattr(module, "COMMANDS", ()):
            if command.name not in cli.commands:
                cli.add_command(command)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """An error message as one printable line: names and bytes from a hostile file may hold
    newlines or terminal escape sequences."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _debugging() -> bool:
    return _DEBUG["on"] or os.environ.get("CKPT_DEBUG", "") not in ("", "0")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises for user errors).

    ``argv`` None reads ``sys.argv``; once the work is done Ctrl-C is then
    ignored, so one that lands while the interpreter shuts down prints no
    traceback. The programs (``ckpt``, ``python -m ckpt_tool``) call run().
    """
    return _run(argv, program=False)


def run() -> NoReturn:
    """The ``ckpt`` program: main() on ``sys.argv``, then an exit without teardown (_exit)."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    code = _run(None, program=on_main_thread)
    if on_main_thread:
        _exit(code)
    sys.exit(code)


def _run(argv: Sequence[str] | None, *, program: bool) -> int:
    """_main with the cyclic GC off, and (as the program) the results kept for _exit.

    Measured (issue 22, CPU seconds, min of 12 runs on a loaded 2-core
    machine, 200,000-tensor files; the ``ckpt`` program as shipped / without
    keep_until_exit and _exit / also with the GC on):
    ``inspect --json`` of a .safetensors 1.50 / 1.58 / 1.68 s, ``inspect`` of a
    .pth 2.39 / 2.53 / 2.82 s. So the GC pause saves 0.1-0.3 s (6-10%) and
    the fast exit another 0.04-0.14 s (3-5%); _exit without keeping the
    results saves nothing, so the two go together. Reading allocates
    millions of small acyclic objects that each GC pass rescans; reference
    counting still frees everything, and main() turns the GC back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    EXITING_FAST["on"] = program
    try:
        return _main(argv)
    finally:
        if argv is None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # As the program the GC stays off: the process ends in a moment, and a
        # collection now would walk every record the command kept (keep_until_exit).
        if was_enabled and not program:
            gc.enable()


def _exit(code: int) -> None:
    """End the program now: output flushed, the results commands kept (keep_until_exit) never freed.

    Every file ckpt writes is closed (and fsynced) before a command returns;
    what is skipped is freeing a large checkpoint's records and the
    interpreter's own teardown (with keep_until_exit: 0.04-0.14 s on 200,000 tensors, see _run).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`ckpt inspect | head`): nothing left to say
            stream.flush()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    _DEBUG["on"] = "--debug" in args[:1] or False
    try:
        code = cli.main(args=args, prog_name="ckpt", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("ckpt: interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("ckpt: interrupted", err=True)
        return 130
    except CkptError as exc:
        if _debugging():
            import traceback  # only here: an import on every run costs 2-3 ms

            traceback.print_exc()
        click.echo(f"ckpt: error: {one_line(exc.message)}", err=True)
        return exc.exit_code
    except MemoryError:
        click.echo("ckpt: error: out of memory (the machine, or a ulimit -v, gave no more)", err=True)
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - last line of defence: one line, never a traceback
        if _debugging():
            import traceback  # only here: an import on every run costs 2-3 ms

            traceback.print_exc()
        text = str(exc).splitlines()[0] if str(exc) else ""
        click.echo(
            f"ckpt: error: unexpected {type(exc).__name__}: {text} "
            "(this is a bug in ckpt; rerun with --debug and report the traceback)",
            err=True,
        )
        return EXIT_ERROR
    return int(code or 0)
