"""ckpt gate (issue 25): a dtype difference from the target is a warning unless asked; --allow-global lifts a
class from every check it would fail, never a call that runs code; check names in one style, old names accepted."""
from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
from models import TinyMLP

from ckpt_tool import gate
from ckpt_tool.commands.gate.names import CheckName
from ckpt_tool.commands.gate.policy import load_policy
from ckpt_tool.errors import UsageError


def check(report, name: str):
    (found,) = [c for c in report.files[0].checks if c.name == name]
    return found


@pytest.fixture
def bf16(tmp_path):
    """A TinyMLP state_dict saved in bfloat16, as a mixed-precision run writes it."""
    torch.manual_seed(0)
    path = tmp_path / "bf16.pth"
    torch.save({k: v.to(torch.bfloat16) for k, v in TinyMLP().state_dict().items()}, path)
    return path


@pytest.fixture
def target(fixtures_dir) -> str:
    return f"{fixtures_dir / 'models.py'}:TinyMLP"


def test_bf16_against_an_fp32_target_is_a_warning_and_torch_agrees(bf16, target):
    module = TinyMLP()
    module.load_state_dict(torch.load(bf16), strict=True)  # what the check stands for: the load casts
    assert module.head.weight.dtype == torch.float32
    c = check(gate([str(bf16)], target=target), "matches-target")
    assert c.passed and not c.skipped
    assert "warning: dtype differs for 7" in c.detail
    assert "bfloat16 in the checkpoint, float32 in the target" in c.detail
    assert "--require-dtype" in c.detail


def test_require_dtype_option_and_policy_key_fail_it(bf16, target, tmp_path):
    c = check(gate([str(bf16)], target=target, require_dtype=True), "matches-target")
    assert not c.passed and "dtype differs for 7" in c.detail and "fails with --require-dtype" in c.detail
    policy = tmp_path / "p.toml"
    policy.write_text("[gate]\nrequire_target_dtype = true\n")
    report = gate([str(bf16)], target=target, policy=load_policy(policy))
    assert not check(report, "matches-target").passed and report.exit_code == 1
    # the option overrides the policy, both ways
    assert check(gate([str(bf16)], target=target, policy=load_policy(policy), require_dtype=False),
                 "matches-target").passed


def test_strict_fails_on_the_dtype_warning_unless_the_policy_ignores_dtypes(bf16, target, tmp_path):
    c = check(gate([str(bf16)], target=target, strict=True), "matches-target")
    assert not c.passed and "fails with --strict" in c.detail
    policy = tmp_path / "p.toml"
    policy.write_text("[gate]\nignore_target_dtype = true\n")
    c = check(gate([str(bf16)], target=target, strict=True, policy=load_policy(policy)), "matches-target")
    # the target's path is left out: a checkout folder may itself be named "dtypes"
    assert c.passed and "dtype" not in c.detail.replace(target, "").replace("(names and shapes)", "")
    assert "names and shapes" in c.detail


def test_require_and_ignore_together_are_refused(tmp_path, bf16, target, run_cli):
    policy = tmp_path / "p.toml"
    policy.write_text("[gate]\nignore_target_dtype = true\nrequire_target_dtype = true\n")
    with pytest.raises(UsageError, match="contradict"):
        load_policy(policy)
    policy.write_text("[gate]\nignore_target_dtype = true\n")
    r = run_cli("gate", str(bf16), "--target", target, "--policy", str(policy), "--require-dtype")
    assert r.code == 2 and "contradict" in r.err and "Traceback" not in r.err


def test_a_key_difference_still_fails_and_names_the_dtype_as_a_warning(tmp_path, target):
    state = {k: v.to(torch.bfloat16) for k, v in TinyMLP().state_dict().items()}
    state["extra.weight"] = torch.zeros(2)
    path = tmp_path / "extra.pth"
    torch.save(state, path)
    c = check(gate([str(path)], target=target), "matches-target")
    assert not c.passed and "unexpected 1: extra.weight" in c.detail
    assert "(a warning: load_state_dict casts)" in c.detail


def test_cli_require_dtype_exit_codes(run_cli, bf16, target):
    r = run_cli("gate", str(bf16), "--target", target)
    assert r.code == 0 and "  warn  matches-target" in r.out and "gate passed" in r.out
    r = run_cli("gate", str(bf16), "--target", target, "--require-dtype")
    assert r.code == 1 and "FAIL  matches-target" in r.out


# ------------------------------------------------------------------ --allow-global, every check it would fail

LAB = '''
import argparse


class Config:
    def __init__(self, lr=0.1):
        self.lr = lr
'''


@pytest.fixture
def lab_checkpoint(tmp_path, monkeypatch):
    """A checkpoint holding an instance of a class from an importable module (mylab_h2.Config), like a
    training script's config object."""
    (tmp_path / "mylab_h2.py").write_text(LAB)
    monkeypatch.syspath_prepend(str(tmp_path))
    import mylab_h2

    path = tmp_path / "lab.pth"
    torch.save({"model": TinyMLP().state_dict(), "config": mylab_h2.Config(), "epoch": 1}, path)
    sys.modules.pop("mylab_h2", None)
    return path


FAILED_BY_A_CLASS = {"loads-safely", "weights-only", "warnings"}


def test_strict_allow_global_lifts_the_class_from_every_check(lab_checkpoint):
    strict = gate([str(lab_checkpoint)], strict=True)
    failed = {c.name for c in strict.files[0].checks if not c.passed}
    assert failed == FAILED_BY_A_CLASS, failed  # each check a class can fail, fails on it
    allowed = gate([str(lab_checkpoint)], strict=True, allow_globals=["mylab_h2.Config"])
    assert allowed.passed, [(c.name, c.detail) for c in allowed.files[0].checks if not c.passed]
    assert allowed.exit_code == 0
    assert "mylab_h2.Config" in check(allowed, "weights-only").detail  # passes *because* it is allowed


def test_allow_global_in_the_policy_file_does_the_same(lab_checkpoint, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[gate]\nstrict = true\nweights_only_allow = ["mylab_h2.Config"]\n')
    assert gate([str(lab_checkpoint)], policy=load_policy(policy)).passed


def test_argparse_namespace_with_strict_and_allow_global_passes(tmp_path, run_cli):
    import argparse

    path = tmp_path / "args.pth"
    torch.save({"model": TinyMLP().state_dict(), "args": argparse.Namespace(lr=0.1, layers=[1, 2])}, path)
    r = run_cli("gate", str(path), "--strict", "--allow-global", "argparse.Namespace", "--json")
    doc = json.loads(r.out)
    assert r.code == 0, [c for c in doc["files"][0]["checks"] if not c["passed"]]
    r = run_cli("gate", str(path), "--strict", "--json")
    failed = {c["name"] for c in json.loads(r.out)["files"][0]["checks"] if not c["passed"]}
    assert r.code == 1 and failed == {"weights-only"}  # torch 2.13's weights_only refuses Namespace


def test_allowing_a_call_that_runs_code_never_passes(tmp_path):
    from tests.helpers.malicious import Reduce

    path = tmp_path / "evil.pth"
    torch.save({"model": TinyMLP().state_dict(), "args": Reduce(os.system, "true")}, path)
    report = gate([str(path)], strict=True, allow_globals=["posix.system", "os.system", "nt.system"])
    assert not report.passed and report.exit_code == 1 and report.files[0].dangerous
    for name in ("loads-safely", "weights-only", "warnings"):
        c = check(report, name)
        assert not c.passed and "system" in c.detail, (name, c.detail)
    assert "cannot allow it" in check(report, "weights-only").detail


# ------------------------------------------------------------------ check names: one style, old names accepted


def test_names_are_one_style_in_json_junit_and_sarif(run_cli, fixtures_dir, tmp_path):
    path = str(fixtures_dir / "tiny_mlp.pth")
    r = run_cli("gate", path, "--json", "--junit", str(tmp_path / "j.xml"), "--sarif", str(tmp_path / "s.sarif"),
                "--sha256", "0" * 64)
    names = [c["name"] for c in json.loads(r.out)["files"][0]["checks"]]
    assert names == ["loads-safely", "weights-only", "matches-target", "no-nan-inf", "dtype-policy", "file-size",
                     "required-metadata", "sha256", "warnings"]
    assert all(n == n.lower() and "_" not in n for n in names)
    cases = [c.get("name") for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")]
    assert cases == names
    sarif = json.loads((tmp_path / "s.sarif").read_text())["runs"][0]
    assert [r["id"] for r in sarif["tool"]["driver"]["rules"]] == [f"gate/{n}" for n in names]
    assert [x["ruleId"] for x in sarif["results"]] == ["gate/sha256"]


@pytest.mark.parametrize("given, member", [
    ("no-nan-inf", CheckName.NO_NAN_INF), ("no_nan_inf", CheckName.NO_NAN_INF), ("NO_NAN_INF", CheckName.NO_NAN_INF),
    ("weights-only", CheckName.WEIGHTS_ONLY), ("weights_only", CheckName.WEIGHTS_ONLY),
    ("matches_target", CheckName.MATCHES_TARGET), ("sha256", CheckName.SHA256),
])
def test_parse_accepts_todays_and_earlier_names(given, member):
    assert CheckName.parse(given) is member


def test_former_names_are_those_earlier_releases_wrote():
    assert [m.former for m in CheckName] == ["loads_safely", "readable", "weights-only", "matches_target",
                                             "no_nan_inf", "dtype_policy", "file_size", "required_metadata",
                                             "sha256", "warnings"]
    assert all(CheckName.parse(m.former) is m for m in CheckName)


def test_skip_takes_either_spelling_in_options_and_the_policy(run_cli, fixtures_dir, tmp_path):
    path = str(fixtures_dir / "tiny_mlp.pth")
    for spelling in ("sha256", "no_nan_inf", "no-nan-inf"):
        r = run_cli("gate", path, "--json", "--skip", spelling, "--sha256", "0" * 64)
        checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
        skipped = CheckName.parse(spelling).value
        assert checks[skipped]["skipped"] and "--skip" in checks[skipped]["detail"]
        assert r.code == (0 if skipped == "sha256" else 1)
    policy = tmp_path / "p.toml"
    policy.write_text('[gate]\nskip = ["matches_target", "weights_only"]\n')
    report = gate([path], policy=load_policy(policy), target=f"{fixtures_dir / 'models.py'}:TinyMLPv2")
    # a skipped matches-target builds nothing: a target that cannot even be imported does not matter
    assert gate([path], policy=load_policy(policy), target="no_such_module_h2:Net").passed
    assert check(report, "matches-target").skipped and check(report, "weights-only").skipped and report.passed


@pytest.mark.parametrize("name", ["loads-safely", "loads_safely", "readable"])
def test_safety_checks_cannot_be_skipped(run_cli, fixtures_dir, name):
    r = run_cli("gate", str(fixtures_dir / "tiny_mlp.pth"), "--skip", name)
    assert r.code == 2 and "cannot be skipped" in r.err


def test_an_unknown_check_name_lists_the_known_ones(run_cli, fixtures_dir):
    r = run_cli("gate", str(fixtures_dir / "tiny_mlp.pth"), "--skip", "nan")
    assert r.code == 2 and "unknown gate check 'nan'" in r.err and "no-nan-inf" in r.err


def test_a_passed_check_with_a_warning_says_so_in_json_and_sarif(run_cli, bf16, target, tmp_path):
    sarif = tmp_path / "g.sarif"
    r = run_cli("gate", str(bf16), "--target", target, "--json", "--sarif", str(sarif))
    assert r.code == 0
    checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
    assert checks["matches-target"]["passed"] and checks["matches-target"]["warning"] is True
    assert not any(c["warning"] for name, c in checks.items() if name != "matches-target")
    run = json.loads(sarif.read_text())["runs"][0]
    assert [(x["ruleId"], x["level"]) for x in run["results"]] == [("gate/matches-target", "warning")]
    rules = {x["id"]: x["shortDescription"]["text"] for x in run["tool"]["driver"]["rules"]}
    assert rules["gate/matches-target"].startswith("The gate check 'matches-target': The state_dict loads strictly")
    r = run_cli("gate", str(bf16), "--target", target, "--sarif", str(sarif), "--require-dtype")
    assert r.code == 1
    assert [(x["ruleId"], x["level"]) for x in json.loads(sarif.read_text())["runs"][0]["results"]] == [
        ("gate/matches-target", "error")]
