"""Options from one place: the reading options become ONE SourceOptions at the CLI edge (cli/options.py
source_options) and in the Python verbs (commands/keywords.py), each option declared once (issue 33)."""
from __future__ import annotations

import dataclasses
import inspect

import click
import pytest

import ckpt_tool
from ckpt_tool.cli.options import (
    key_option,
    limit_options,
    source_options,
    tp_rules_option,
    unstack_layers_option,
)
from ckpt_tool.commands.diff import DiffCall, DiffOptions
from ckpt_tool.commands.gate import GateCall, GateOptions
from ckpt_tool.commands.inspect import InspectCall, InspectOptions
from ckpt_tool.commands.keywords import options_of, source_of
from ckpt_tool.commands.migrate import MigrateCall, MigrateOptions
from ckpt_tool.commands.scan import ScanCall, ScanOptions
from ckpt_tool.formats.options import SourceOptions
from ckpt_tool.formats.tp import TpRules
from ckpt_tool.limits import DEFAULT_LIMITS
from tests.helpers import tp_fixtures as tp

# What each command offered before the options moved (CONTRACT: "Options that every reading command takes
# where they apply"); none may gain one silently.
OFFERED = {
    "inspect": {"--key", "--unsafe", "--tp-rules", "--unstack-layers", "--torch-version", "--download"},
    "migrate": {"--key", "--unsafe", "--tp-rules", "--unstack-layers", "--download"},
    "diff": {"--key", "--unsafe", "--tp-rules", "--torch-version", "--download"},
    "gate": {"--key", "--tp-rules", "--torch-version", "--download"},
    "scan": {"--download"},
}
READING = {"--key", "--unsafe", "--tp-rules", "--unstack-layers", "--torch-version", "--download"}


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(tp.TP_RULES)
    return path


def _seen() -> tuple[click.Command, list[SourceOptions]]:
    seen: list[SourceOptions] = []

    @click.command()
    @key_option
    @tp_rules_option
    @unstack_layers_option
    @limit_options
    @source_options
    def cmd(source: SourceOptions, **rest: object) -> int:
        assert not rest  # every reading option went into ``source``
        seen.append(source)
        return 0

    return cmd, seen


def test_the_decorator_hands_one_frozen_source_with_the_rules_parsed(rules_file):
    cmd, seen = _seen()
    r = click.testing.CliRunner().invoke(cmd, ["--key", "model", "--tp-rules", str(rules_file), "--unstack-layers",
                                               "--max-tensors", "7"])
    assert r.exit_code == 0, r.output
    (source,) = seen
    assert isinstance(source.tp_rules, TpRules) and source.tp_rules.origin == str(rules_file)
    assert (source.key, source.unstack_layers, source.limits.max_tensors) == ("model", True, 7)
    assert source.limits.max_pickle_bytes == DEFAULT_LIMITS.max_pickle_bytes
    assert not source.unsafe and source.torch_version is None  # not declared: the defaults, never a guess
    with pytest.raises(dataclasses.FrozenInstanceError):
        source.unsafe = True  # type: ignore[misc]


def test_options_a_command_does_not_declare_keep_their_defaults():
    cmd, seen = _seen()
    assert click.testing.CliRunner().invoke(cmd, []).exit_code == 0
    assert seen == [SourceOptions()]
    assert "--unsafe" not in click.testing.CliRunner().invoke(cmd, ["--help"]).output


@pytest.mark.parametrize("command", sorted(OFFERED))
def test_each_command_offers_the_reading_options_it_offered(run_cli, command):
    out = run_cli(command, "--help").out
    offered = {opt for opt in READING if f"{opt} " in out or f"{opt}\n" in out or f"{opt}," in out}
    assert offered == OFFERED[command]
    assert ("--max-tensors" in out) == (command != "doctor")


@pytest.mark.parametrize("args", [["inspect", "missing.pth"], ["migrate", "missing.pth", "-o", "o.pth"],
                                  ["gate", "missing.pth"], ["diff", "missing.pth", "missing_b.pth"]])
def test_a_bad_rules_file_is_exit_2_before_any_input_is_opened(tmp_path, run_cli, args):
    bad = tmp_path / "rules.toml"
    bad.write_text("[[tp]]\npattern = 'a'\n")
    r = run_cli(*args, "--tp-rules", str(bad))
    assert r.code == 2 and "rules.toml" in r.err and "needs 'dim'" in r.err, r.err
    assert "no such file" not in r.err and not (tmp_path / "o.pth").exists()


@pytest.mark.parametrize(("verb", "call", "options"), [
    (ckpt_tool.inspect, InspectCall, InspectOptions), (ckpt_tool.migrate, MigrateCall, MigrateOptions),
    (ckpt_tool.gate, GateCall, GateOptions), (ckpt_tool.scan, ScanCall, ScanOptions),
    (ckpt_tool.diff, DiffCall, DiffOptions),
])
def test_a_verbs_keywords_are_its_call_dataclass_fields(verb, call, options):
    params = inspect.signature(verb).parameters
    assert list(params) == list(inspect.signature(call).parameters)
    assert set(params) >= {f.name for f in dataclasses.fields(options)}
    assert ("unsafe" in params) == (call in (InspectCall, MigrateCall, DiffCall))  # gate and scan never unpickle


def test_a_call_splits_into_the_source_and_the_commands_options(rules_file):
    call = InspectCall("m.pth", key="ema", stats=True, tp_rules=str(rules_file), torch_version="2.6")
    source = source_of(call)
    assert (source.key, source.torch_version, source.unsafe) == ("ema", "2.6", False)
    assert isinstance(source.tp_rules, TpRules)
    assert options_of(InspectOptions, call) == InspectOptions(stats=True)
    assert source_of(ScanCall(["m.pth"])) == SourceOptions()


def test_the_verbs_take_their_keywords_as_before(fixtures_dir, tmp_path):
    pth = str(fixtures_dir / "tiny_mlp.pth")
    assert ckpt_tool.inspect(pth, stats=True).stats is not None
    assert ckpt_tool.gate([pth], nan_check=True, torch_version="2.6").passed
    assert ckpt_tool.scan([pth], strict=True).exit_code == 0
    assert ckpt_tool.diff(pth, str(fixtures_dir / "tiny_mlp.safetensors"), values=True, key_b=None).equal
    report = ckpt_tool.migrate(pth, str(tmp_path / "o.safetensors"), strip_prefix=["nothing."], workers=1)
    assert report.ok and report.written
    with pytest.raises(TypeError):
        ckpt_tool.gate([pth], unsafe=True)  # type: ignore[call-arg]
