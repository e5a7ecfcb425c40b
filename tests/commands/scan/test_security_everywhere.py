"""Every malicious file of the scan corpus (tests/helpers/malicious.py) through every command, in a subprocess.

Each payload creates its own marker file when it runs. The corpus (plus two
more cases built here: a payload in one shard of a sharded .bin set and in
a TorchScript archive's constants.pkl) goes through inspect (plain, --json,
--stats, --tree), diff (against a clean file and itself, --values), migrate
(to .pth with and without --state-dict-only, .safetensors, a sharded
folder), gate (strict and not) and scan, in fresh interpreters that never
pass --unsafe. Afterwards no marker exists; every run exited 0, 1 or 2 with
at most one error line and no traceback.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.malicious import Case, Reduce, build_corpus
from tests.helpers.reliability import INTERNAL_ERROR, ROOT

RUNNER = r"""
import contextlib, io, json, os, sys
sys.path.insert(0, sys.argv[1])
from ckpt_tool.cli import main
jobs = json.loads(sys.stdin.read())
results = []
for name, argv in jobs:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except BaseException as exc:  # a crash of main itself is a finding, reported below
            code = f"raised {type(exc).__name__}: {exc}"
    results.append({"name": name, "argv": argv, "code": code, "err": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Case]:
    folder = tmp_path_factory.mktemp("corpus")
    cases = build_corpus(str(folder))
    markers = Path(cases[0].marker).parent
    cases += [_malicious_shard(folder, markers), _malicious_torchscript_constants(folder, markers)]
    assert not any(markers.iterdir())
    return cases


def _malicious_shard(folder: Path, markers: Path) -> Case:
    """A sharded .bin set whose second shard carries a payload next to its tensors."""
    import torch

    marker = markers / "sharded_bin_shard"
    dst = folder / "sharded_bin"
    shutil.copytree(ROOT / "fixtures" / "sharded_bin", dst)
    shard = dst / "pytorch_model-00002-of-00002.bin"
    sd = torch.load(shard, weights_only=True)
    sd["hook"] = Reduce(os.system, f"touch '{marker}'")
    torch.save(sd, shard)
    return Case("sharded_bin_shard", str(dst), str(marker), "torch", "payload in one shard of a .bin set")


def _malicious_torchscript_constants(folder: Path, markers: Path) -> Case:
    """A TorchScript archive whose constants.pkl is a payload (jit.load would unpickle it)."""
    marker = markers / "torchscript_constants"
    src = ROOT / "fixtures" / "torchscript.pt"
    dst = folder / "torchscript_constants.pt"
    payload = pickle.dumps(Reduce(os.system, f"touch '{marker}'"), protocol=2)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = payload if info.filename.endswith("/constants.pkl") else zin.read(info)
            zout.writestr(info, data)
    return Case("torchscript_constants", str(dst), str(marker), None, "payload in a TorchScript constants.pkl")


def _jobs(cases: list[Case], out: Path, commands: str) -> list[tuple[str, list[str]]]:
    clean = str(ROOT / "fixtures" / "tiny_mlp.pth")
    jobs: list[tuple[str, list[str]]] = []
    for i, c in enumerate(cases):
        p = c.path
        if commands == "read":
            jobs += [(c.name, ["inspect", p]), (c.name, ["inspect", "--json", p]),
                     (c.name, ["inspect", "--stats", "--tree", p]), (c.name, ["diff", p, clean]),
                     (c.name, ["diff", "--values", clean, p]), (c.name, ["diff", "--json", p, p]),
                     (c.name, ["scan", "--json", p])]
        else:
            jobs += [(c.name, ["migrate", p, "-o", str(out / f"{i}.pth"), "--device", "cpu"]),
                     (c.name, ["migrate", p, "-o", str(out / f"{i}-sd.pth"), "--state-dict-only", "--device", "cpu"]),
                     (c.name, ["migrate", p, "-o", str(out / f"{i}.safetensors"), "--device", "cpu"]),
                     (c.name, ["migrate", p, "-o", str(out / f"{i}-shards"), "--max-shard-size", "1KB",
                               "--device", "cpu"]),
                     (c.name, ["gate", p]), (c.name, ["gate", "--strict", "--json", p])]
    return jobs


def _run(jobs: list[tuple[str, list[str]]], cwd: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(ROOT)], input=json.dumps(jobs), capture_output=True,
                          text=True, timeout=600, cwd=str(cwd), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _bad_runs(results: list[dict]) -> list[tuple]:
    bad = []
    for r in results:
        lines = r["err"].strip().splitlines()
        many = len(lines) > 1 and r["argv"][0] != "scan"  # scan lists one line per problem of a file
        if r["code"] not in (0, 1, 2) or many or "Traceback" in r["err"] or INTERNAL_ERROR.search(r["err"]):
            bad.append((r["name"], r["argv"][0], r["code"], r["err"][:300]))
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("commands", ["read", "write"])
def test_no_payload_runs_in_any_command(corpus, tmp_path, commands):
    results = _run(_jobs(corpus, tmp_path, commands), tmp_path)
    ran = sorted(c.name for c in corpus if os.path.exists(c.marker))
    assert ran == [], f"payloads ran: {ran}"
    assert _bad_runs(results) == []
    by_command: dict[str, set] = {}
    for r in results:
        by_command.setdefault(" ".join(a for a in r["argv"][:2] if a.startswith("-") or a == r["argv"][0]),
                              set()).add(r["code"])
    if commands == "write":
        # a dangerous reference never passes the gate
        gate = [r for r in results if r["argv"][0] == "gate" and r["name"] in DANGEROUS]
        assert gate and all(r["code"] != 0 for r in gate), [(r["name"], r["code"]) for r in gate]
        # nothing dangerous is ever written back into a torch output
        assert not [r for r in results if r["argv"][0] == "migrate" and r["code"] == 0 and ".pth" in r["argv"][3]
                    and "--state-dict-only" not in r["argv"] and r["name"] in PAYLOAD_IN_METADATA]


# Cases whose payload sits in the metadata (not in the state_dict): a torch output must not carry it.
PAYLOAD_IN_METADATA = {"optimizer_entry", "args_entry", "dill_os_system"}
DANGEROUS = {"os_system", "posix_system", "builtins_exec", "builtins_eval", "subprocess_popen", "runpy_run_code",
             "inst_opcode", "memo_stack_global", "tuple_memo_stack_global", "compat_commands", "optimizer_entry",
             "args_entry", "second_zip_member", "legacy_format", "pickle_before_zip", "misleading_extension",
             "dill_os_system", "sharded_bin_shard", "torchscript_constants"}


def test_migrated_outputs_of_malicious_files_are_clean(corpus, tmp_path):
    """What migrate writes from a malicious file scans safe: the payload is never copied into it."""
    jobs = [(c.name, ["migrate", c.path, "-o", str(tmp_path / f"{i}.pth"), "--state-dict-only", "--device", "cpu"])
            for i, c in enumerate(corpus)]
    results = _run(jobs, tmp_path)
    written = [tmp_path / f"{i}.pth" for i, r in enumerate(results) if r["code"] == 0]
    assert written  # the state_dicts beside the payloads are still usable
    scan = _run([("outputs", ["scan", "--json", *map(str, written)])], tmp_path)[0]
    assert scan["code"] == 0, scan
    assert not any(os.path.exists(c.marker) for c in corpus)


def test_the_markers_would_show_a_payload_that_ran(tmp_path):
    """The harness can fail: loading one case the way a victim does creates its marker."""
    cases = [c for c in build_corpus(str(tmp_path)) if c.name == "os_system"]
    code = "import pickle,sys; pickle.load(open(sys.argv[1], 'rb'))"
    subprocess.run([sys.executable, "-c", code, cases[0].path], capture_output=True, timeout=60, check=False)
    assert os.path.exists(cases[0].marker)
