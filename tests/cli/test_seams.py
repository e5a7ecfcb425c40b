"""The CLI's shared seams: one progress adapter, one exit-code mapping, options declared once."""
from __future__ import annotations

from dataclasses import dataclass

import click
import pytest

from ckpt_tool.cli.options import target_options
from ckpt_tool.cli.progress import Bars, progress_bars
from ckpt_tool.cli.report_exit import ExitCode, exit_code
from ckpt_tool.exit_codes import outcome_code


def test_bars_draw_nothing_when_disabled(capsys):
    bars = Bars(False)
    bars.start("reading tensors", 10)
    bars.advance(10)
    bars.done()
    assert capsys.readouterr() == ("", "")


def test_no_bars_off_a_terminal_or_under_quiet(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert progress_bars(quiet=False).enabled
    assert not progress_bars(quiet=True).enabled
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert not progress_bars(quiet=False).enabled


def test_bars_count_every_step(monkeypatch):
    drawn: list[int] = []

    class Bar:
        def update(self, n_steps: int) -> None:
            drawn.append(n_steps)

        def render_finish(self) -> None:
            drawn.append(-1)

    monkeypatch.setattr(click, "progressbar", lambda **kw: Bar())
    bars = Bars(True)
    bars.start("comparing values", 1000)  # throttled: a redraw every 5 steps
    for _ in range(1003):
        bars.advance(1)
    bars.done()
    assert sum(n for n in drawn if n > 0) == 1003 and drawn[-1] == -1 and len(drawn) < 210


@pytest.mark.parametrize(("facts", "code"), [
    ({}, 0), ({"failed": True}, 1), ({"unreadable": True}, 2), ({"unreadable": True, "failed": True}, 2),
    ({"dangerous": True, "unreadable": True}, 1),  # a CI job must see the danger
])
def test_one_precedence_rule(facts, code):
    assert outcome_code(**facts) == code


def test_every_kind_of_report_maps_to_its_code():
    @dataclass(frozen=True)
    class Diffed:
        equal: bool

    @dataclass(frozen=True)
    class Migrated:
        ok: bool

    @dataclass(frozen=True)
    class Gated:
        exit_code: int

    assert [exit_code(Diffed(True)), exit_code(Diffed(False))] == [ExitCode.OK, ExitCode.FINDING]
    assert [exit_code(Migrated(True)), exit_code(Migrated(False))] == [ExitCode.OK, ExitCode.FINDING]
    assert exit_code(Gated(2)) is ExitCode.ERROR


def test_target_options_are_one_declaration():
    @click.command()
    @target_options("Compare with a module")
    def cmd(target: str | None, target_kwargs: str | None) -> None:
        click.echo(f"{target} {target_kwargs}")

    names = [p.name for p in cmd.params]
    assert names == ["target", "target_kwargs"]
    assert cmd.params[0].help is not None and cmd.params[0].help.startswith("Compare with a module: ")
