"""Nothing unread is safe (issue 21): unreadable folders and files, symbolic links, empty files, and a
dangerous file that is also broken, in scan, gate and inspect.

Permission cases run ckpt as a user without root's file capabilities
(``setpriv`` drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH; as root a mode-000
folder is still readable, so a test that did not drop them could not fail).
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.malicious import Reduce

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "fixtures"
SETPRIV = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
           "--bounding-set=-dac_override,-dac_read_search"]


def _evil(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(Reduce(os.system, f"touch {marker}"), protocol=2))


def ckpt(*args: str, unprivileged: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ckpt_tool ARGS`` in a fresh process; ``unprivileged``: without root's file capabilities."""
    cmd = [sys.executable, "-m", "ckpt_tool", *args]
    if unprivileged and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is not installed: cannot drop root's file capabilities to test permissions")
        cmd = SETPRIV + cmd
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)


def _unlistable(folder: Path) -> None:
    """Make ``folder`` unreadable, and prove the ckpt subprocess really cannot list it."""
    folder.chmod(0)
    probe = [sys.executable, "-c", f"import os; os.listdir({str(folder)!r})"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is not installed: cannot drop root's file capabilities to test permissions")
        probe = SETPRIV + probe
    r = subprocess.run(probe, check=False, capture_output=True, text=True)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr


@pytest.fixture
def restore_modes(tmp_path):
    yield
    for root, dirs, _files in os.walk(tmp_path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)


# ------------------------------------------------------------ unreadable folders and files


@pytest.fixture
def folder_with_hidden_payload(tmp_path, restore_modes):
    """A sharded .bin set whose sub-folder (mode 000) holds a malicious pickle."""
    d = tmp_path / "model"
    shutil.copytree(FIXTURES / "sharded_bin", d)
    (d / "sub").mkdir()
    marker = tmp_path / "PWNED"
    _evil(d / "sub" / "evil.pkl", marker)
    _unlistable(d / "sub")
    yield d, marker
    assert not marker.exists()


@pytest.mark.parametrize("strict", [[], ["--strict"]])
def test_scan_of_a_folder_with_an_unreadable_subfolder_is_an_error(folder_with_hidden_payload, strict):
    d, _ = folder_with_hidden_payload
    r = ckpt("scan", *strict, str(d), unprivileged=True)
    assert r.returncode == 2, r
    assert f"{d / 'sub'}: cannot list this folder: permission denied" in r.stderr
    assert "ERROR" in r.stdout and str(d / "sub") in r.stdout and "1 unreadable" in r.stdout
    assert "Traceback" not in r.stderr
    doc = json.loads(ckpt("scan", "--json", *strict, str(d), unprivileged=True).stdout)
    (entry,) = [f for f in doc["files"] if f["path"] == str(d / "sub")]
    assert entry["verdict"] == "error" and entry["format"] == "folder"
    assert "permission denied" in entry["errors"][0]
    assert doc["passed"] is False and doc["counts"]["error"] == 1


def test_gate_and_inspect_of_a_folder_with_an_unreadable_subfolder_are_errors(folder_with_hidden_payload):
    d, _ = folder_with_hidden_payload
    r = ckpt("gate", "--json", str(d), unprivileged=True)
    assert r.returncode == 2, r
    (f,) = json.loads(r.stdout)["files"]
    assert f["passed"] is False and "sub" in f["error"] and f["dangerous"] is False
    safely = next(c for c in f["checks"] if c["name"] == "loads-safely")
    assert not safely["passed"] and "permission denied" in safely["detail"]
    r = ckpt("inspect", str(d), unprivileged=True)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.strip().splitlines() == [
        f"ckpt: error: {d / 'sub'}: cannot list this folder: permission denied; what it holds was not read, "
        "so it is not safe"]


def test_unreadable_file_inside_a_folder_is_an_error(tmp_path, restore_modes):
    d = tmp_path / "model"
    shutil.copytree(FIXTURES / "sharded_bin", d)
    _evil(d / "extra.pkl", tmp_path / "PWNED")
    (d / "extra.pkl").chmod(0)
    for command in ("scan", "gate", "inspect"):
        r = ckpt(command, str(d), unprivileged=True)
        assert r.returncode == 2, (command, r)
        assert "extra.pkl" in r.stderr and "ermission denied" in r.stderr, (command, r.stderr)


def test_dangerous_file_beside_an_unreadable_folder_still_fails_with_1(folder_with_hidden_payload):
    d, marker = folder_with_hidden_payload
    _evil(d / "visible.pkl", marker)
    r = ckpt("scan", str(d), unprivileged=True)
    assert r.returncode == 1 and "posix.system" in r.stdout and "sub" in r.stderr, r
    r = ckpt("gate", str(d), unprivileged=True)
    assert r.returncode == 1 and "posix.system" in r.stdout, r


# ----------------------------------------------------------------------------- symbolic links


def _link_tree(tmp_path: Path) -> tuple[Path, Path]:
    """scanned/ holds a clean file, a link to a folder outside it (a malicious pickle inside),
    a second link to that folder, a link to its own parent, a link to itself and a file link."""
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = tmp_path / "PWNED"
    _evil(outside / "evil.pkl", marker)
    d = tmp_path / "scanned"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "ok.pth")
    (d / "a_link").symlink_to(outside, target_is_directory=True)
    (d / "b_again").symlink_to(outside, target_is_directory=True)
    (d / "sub").mkdir()
    (d / "sub" / "up").symlink_to("..", target_is_directory=True)  # a loop
    (d / "same.pth").symlink_to("ok.pth")
    return d, marker


def test_symlinked_folders_are_followed_once_and_said(tmp_path):
    d, marker = _link_tree(tmp_path)
    r = ckpt("scan", "--json", str(d), timeout=60)  # a loop must not hang
    assert r.returncode == 1, r
    doc = json.loads(r.stdout)
    paths = [f["path"] for f in doc["files"]]
    assert paths.count(str(d / "a_link" / "evil.pkl")) == 1 and len(paths) == 2, paths  # ok.pth, evil.pkl once
    assert str(d / "ok.pth") in paths and not any("same.pth" in p or "b_again" in p for p in paths)
    links = {link["path"]: link for link in doc["links"]}
    assert links[str(d / "a_link")]["action"] == "followed" and links[str(d / "a_link")]["kind"] == "folder"
    assert links[str(d / "b_again")]["action"] == "already read"
    assert links[str(d / "b_again")]["first"] == str(d / "a_link")
    assert links[str(d / "sub" / "up")]["action"] == "already read" and links[str(d / "sub" / "up")]["first"] == str(d)
    assert links[str(d / "same.pth")]["action"] == "already read"
    text = ckpt("scan", str(d)).stdout
    assert f"followed the symbolic link {d / 'a_link'} -> {tmp_path / 'outside'} (folder)" in text
    assert f"did not follow the symbolic link {d / 'sub' / 'up'}" in text
    assert not marker.exists()


def test_a_link_to_itself_is_an_error_and_does_not_hang(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "ok.pth")
    (d / "loop").symlink_to("loop")
    (d / "gone.pth").symlink_to(tmp_path / "missing.pth")
    r = ckpt("scan", str(d), timeout=60)
    assert r.returncode == 2, r
    assert f"{d / 'loop'}: a symbolic link loop" in r.stderr
    assert f"{d / 'gone.pth'}: a symbolic link to {tmp_path / 'missing.pth'}, which does not exist" in r.stderr


# ------------------------------------------------------------------------------ empty files


def test_empty_files_are_skipped_with_skip_other_and_named(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "ok.pth")
    (d / "model.pth").write_bytes(b"")
    (d / "__init__.py").write_bytes(b"")
    r = ckpt("scan", "--skip-other", str(d))
    assert r.returncode == 0, r
    assert f"{d / 'model.pth'}  (empty file (0 bytes))" in r.stdout
    assert f"{d / '__init__.py'}  (empty file (0 bytes))" in r.stdout
    doc = json.loads(ckpt("scan", "--skip-other", "--json", str(d)).stdout)
    assert {"path": str(d / "model.pth"), "reason": "empty file (0 bytes)"} in doc["skipped_files"]
    assert str(d / "__init__.py") in doc["skipped"]
    # without --skip-other an empty file with a checkpoint's name is a truncated checkpoint: an error
    r = ckpt("scan", str(d))
    assert r.returncode == 2 and f"{d / 'model.pth'}: empty file (0 bytes)" in r.stderr, r
    assert "__init__.py" not in r.stderr and "__init__.py" in r.stdout  # skipped, and named
    # a named empty file: an error, or skipped and named with --skip-other
    r = ckpt("scan", str(d / "model.pth"))
    assert r.returncode == 2 and "empty file" in r.stderr
    r = ckpt("scan", "--skip-other", str(d / "model.pth"), str(d / "ok.pth"))
    assert r.returncode == 0 and "model.pth  (empty file (0 bytes))" in r.stdout, r


# ------------------------------------------------- dangerous and unreadable: the gate fails


def _broken_tail(path: Path, marker: Path) -> None:
    data = pickle.dumps(Reduce(os.system, f"touch {marker}"), protocol=2)
    path.write_bytes(data[:-1] + b"\xff\xff not a pickle any more")


def test_payload_followed_by_a_broken_tail_fails_the_gate(tmp_path):
    marker = tmp_path / "PWNED"
    bad = tmp_path / "broken.pkl"
    _broken_tail(bad, marker)
    r = ckpt("gate", "--json", str(bad))
    assert r.returncode == 1, r
    (f,) = json.loads(r.stdout)["files"]
    assert f["dangerous"] is True and f["passed"] is False
    checks = {c["name"]: c for c in f["checks"]}
    assert not checks["loads-safely"]["passed"] and "posix.system" in checks["loads-safely"]["detail"]
    assert not checks["readable"]["passed"] and "not a readable pickle" in checks["readable"]["detail"]
    assert "not a readable pickle" in f["error"]  # the read failure is still reported
    r = ckpt("gate", str(bad))
    assert r.returncode == 1 and "posix.system" in r.stdout and "not a readable pickle" in r.stderr
    # scan: dangerous, naming the call; inspect: an error naming it
    r = ckpt("scan", "--json", str(bad))
    assert r.returncode == 1
    (s,) = json.loads(r.stdout)["files"]
    assert s["verdict"] == "dangerous"
    assert {"module": "posix", "name": "system", "severity": "dangerous"}.items() <= s["globals"][0].items()
    r = ckpt("inspect", str(bad))
    assert r.returncode == 2 and "posix.system" in r.stderr
    # with an unreadable file beside it, the gate still fails with 1
    r = ckpt("gate", str(bad), str(tmp_path / "missing.pth"))
    assert r.returncode == 1, r
    assert not marker.exists()
