"""s3:// against moto's S3 server and hf:// against a Hub-like endpoint, both on 127.0.0.1.

Request counts come from the servers' own logs: moto's werkzeug request log,
and RangeServer's log for the Hub endpoint (HF_ENDPOINT points at it).
"""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from conftest import FIXTURES

from tests.helpers.errors import assert_one_line_error

pytest.importorskip("fsspec")
pytest.importorskip("huggingface_hub")

from tests.helpers.remote_servers import RangeServer, comparable_doc

FILES = ("tiny_mlp.safetensors", "tiny_mlp.pth", "legacy.pth", "training.pth")
FOLDERS = ("sharded", "sharded_bin", "dcp")
TRAINING = ("deepspeed/zero3_fp32", "deepspeed/zero2_bf16", "dcp_multi/fsdp2")  # nested: a run folder and its tag
# issue 24's layouts: per-rank DTensor files, torch's distributed safetensors, a universal checkpoint (through
# latest_universal) and a tensor-parallel run merged by its universal_checkpoint_info
LAYOUTS = ("ranks/verl", "dist_safetensors/run", "deepspeed_parallel/universal", "deepspeed_parallel/tp")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")




@pytest.fixture(scope="module")
def env_saved():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


# -- S3 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(env_saved):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    import boto3

    from tests.helpers.remote_servers import S3Server

    server = S3Server().start()
    os.environ.update(AWS_ENDPOINT_URL_S3=server.url, AWS_ENDPOINT_URL=server.url, AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing-secret-key", AWS_DEFAULT_REGION="us-east-1")
    client = boto3.client("s3", endpoint_url=server.url)
    client.create_bucket(Bucket="ckpts")
    for name in FILES:
        client.upload_file(str(FIXTURES / name), "ckpts", name)
    for folder in FOLDERS + TRAINING + LAYOUTS:
        for path in sorted(p for p in (FIXTURES / folder).rglob("*") if p.is_file()):
            client.upload_file(str(path), "ckpts", f"{path.relative_to(FIXTURES).as_posix()}")
    try:
        yield server
    finally:
        server.stop()


def _s3_log(server, part: str) -> list[str]:
    return [_ANSI.sub("", line) for line in server.requests(part)]


@pytest.mark.parametrize("name,limit", [("tiny_mlp.safetensors", 2), ("tiny_mlp.pth", 4), ("legacy.pth", 4),
                                        ("training.pth", 4), ("sharded/", 5), ("sharded_bin/", 5),
                                        ("sharded/model.safetensors.index.json", 3), ("dcp/", 1)])
def test_s3_inspect_gives_the_local_json(run_cli, s3, name: str, limit: int) -> None:
    local = run_cli("inspect", "--json", str(FIXTURES / name))
    s3.clear()
    remote = run_cli("inspect", "--json", f"s3://ckpts/{name}")
    assert remote.code == 0, remote
    got, want = comparable_doc(remote.out), comparable_doc(local.out)
    if name in ("dcp/", "sharded/", "sharded_bin/"):
        got.pop("file_bytes")  # a folder's size comes from a listing only when one was read
        want.pop("file_bytes")
    assert got == want
    log = _s3_log(s3, "/ckpts")
    assert 1 <= len(log) <= limit, log
    assert json.loads(remote.out)["remote"]["requests"] == len(log)


def test_s3_folder_without_a_slash_is_listed(run_cli, s3) -> None:
    r = run_cli("inspect", "--json", "s3://ckpts/dcp")
    assert r.code == 0, r
    assert comparable_doc(r.out) == comparable_doc(run_cli("inspect", "--json", str(FIXTURES / "dcp")).out)


def test_s3_without_s3fs_names_the_extra(run_cli, monkeypatch) -> None:
    import sys

    for name in [m for m in list(sys.modules) if m == "s3fs" or m.startswith("s3fs.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs now fails
    import fsspec  # noqa: F401 - loads fsspec.registry, whose name the package rebinds to a mapping

    registry = sys.modules["fsspec.registry"]._registry  # fsspec's cache of imported classes
    monkeypatch.delitem(registry, "s3", raising=False)
    r = run_cli("inspect", "s3://ckpts/tiny_mlp.pth")
    assert_one_line_error(r, "s3://ckpts/tiny_mlp.pth", "pip install 'ckpt-tool[remote]'")


def test_s3_not_found(run_cli, s3) -> None:
    r = run_cli("inspect", "s3://ckpts/missing.pth")
    assert_one_line_error(r, "s3://ckpts/missing.pth", "no such file")


def test_s3_gate_and_scan(run_cli, s3) -> None:
    r = run_cli("gate", "--json", "s3://ckpts/tiny_mlp.pth")
    assert r.code == 0, r
    assert json.loads(r.out)["passed"]
    scan = run_cli("scan", "--json", "s3://ckpts/legacy.pth")
    assert scan.code == 0 and json.loads(scan.out)["files"][0]["verdict"] == "safe"
    assert "testing-secret-key" not in r.out + r.err + scan.out + scan.err


# -- the Hugging Face Hub --------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory, env_saved):
    root = tmp_path_factory.mktemp("hub")
    repo = root / "org" / "repo"
    repo.mkdir(parents=True)
    for name in FILES:
        shutil.copy(FIXTURES / name, repo / name)
    for folder in FOLDERS + TRAINING + LAYOUTS:
        shutil.copytree(FIXTURES / folder, repo / folder)
    with RangeServer(root, hub=True) as server:
        os.environ["HF_ENDPOINT"] = server.url
        os.environ["HF_TOKEN"] = "hf_test_token_never_printed"
        os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
        yield server


def _hub_log(server: RangeServer) -> list:
    return [r for r in server.requests() if not r.path.startswith("/api/agent-harnesses")]


@pytest.mark.parametrize("name,limit", [("tiny_mlp.safetensors", 2), ("tiny_mlp.pth", 4), ("legacy.pth", 4),
                                        ("sharded/model.safetensors.index.json", 3), ("sharded", 6),
                                        ("dcp", 5), ("dcp/", 1), ("sharded/", 6)])
def test_hf_inspect_gives_the_local_json(run_cli, hub: RangeServer, name: str, limit: int) -> None:
    local = run_cli("inspect", "--json", str(FIXTURES / name))
    hub.clear()
    remote = run_cli("inspect", "--json", f"hf://org/repo/{name}")
    assert remote.code == 0, remote
    got, want = comparable_doc(remote.out), comparable_doc(local.out)
    if name.endswith("/"):  # a folder's size comes from a listing only when one was read
        got.pop("file_bytes")
        want.pop("file_bytes")
    assert got == want
    log = _hub_log(hub)
    assert 1 <= len(log) <= limit, [(r.path, r.range) for r in log]
    file_reads = [r for r in log if "/resolve/" in r.path and r.status == 206]
    assert all(r.headers.get("authorization") == "Bearer hf_test_token_never_printed" for r in file_reads)
    assert "hf_test_token_never_printed" not in remote.out + remote.err


def test_hf_missing_repository_and_file(run_cli, hub: RangeServer) -> None:
    assert_one_line_error(run_cli("inspect", "hf://org/repo/nothere.pth"), "hf://org/repo/nothere.pth")
    assert_one_line_error(run_cli("inspect", "hf://org/nope/model.pth"), "hf://org/nope/model.pth")


def test_hf_diff_values_against_local(run_cli, hub: RangeServer) -> None:
    r = run_cli("diff", "--values", "--json", "hf://org/repo/tiny_mlp.safetensors", str(FIXTURES / "tiny_mlp.pth"))
    assert r.code == 0, r
    assert json.loads(r.out)["equal"]


# -- DeepSpeed runs and multi-rank DCP folders (tests/io/test_remote_training.py for https://) -------------


def _training_doc(out: str) -> dict:
    from test_remote_training import training_doc

    return training_doc(out)


# (folder, requests): a look for .metadata, then for DeepSpeed the folder's listing, ``latest`` (a tag
# folder's listing says it is not there: no request), the tag's listing and one per rank file;
# a DCP folder: .metadata alone
@pytest.mark.parametrize("name,requests", [("deepspeed/zero3_fp32/", 8), ("deepspeed/zero2_bf16/global_step1/", 5),
                                           ("dcp_multi/fsdp2/", 1)])
def test_s3_training_folders_give_the_local_json(run_cli, s3, name: str, requests: int) -> None:
    local = run_cli("inspect", "--json", str(FIXTURES / name))
    s3.clear()
    remote = run_cli("inspect", "--json", f"s3://ckpts/{name}")
    assert remote.code == 0, remote
    assert _training_doc(remote.out) == _training_doc(local.out)
    log = _s3_log(s3, "/ckpts")
    assert len(log) == requests, log
    assert json.loads(remote.out)["remote"]["requests"] == len(log)


def test_s3_consolidation_gives_the_local_output(run_cli, s3, tmp_path) -> None:
    from test_remote_training import _digest

    for source, output in (("deepspeed/zero3_fp32", "model.safetensors"), ("dcp_multi/fsdp2", "model.pth")):
        (tmp_path / "local").mkdir(exist_ok=True)
        (tmp_path / "remote").mkdir(exist_ok=True)
        local_out, remote_out = tmp_path / "local" / output, tmp_path / "remote" / output
        assert run_cli("migrate", str(FIXTURES / source), "-o", str(local_out)).code == 0
        s3.clear()
        r = run_cli("migrate", "--json", f"s3://ckpts/{source}/", "-o", str(remote_out))
        assert r.code == 0, r
        assert _digest(remote_out) == _digest(local_out)
        assert json.loads(r.out)["remote"]["requests"] == len(_s3_log(s3, "/ckpts"))


# hf://: as s3://, plus huggingface_hub's look at the repository before its first listing
@pytest.mark.parametrize("name,requests", [("deepspeed/zero3_fp32/", 9), ("dcp_multi/fsdp2/", 1)])
def test_hf_training_folders_give_the_local_json(run_cli, hub: RangeServer, name: str, requests: int) -> None:
    local = run_cli("inspect", "--json", str(FIXTURES / name))
    hub.clear()
    remote = run_cli("inspect", "--json", f"hf://org/repo/{name}")
    assert remote.code == 0, remote
    assert _training_doc(remote.out) == _training_doc(local.out)
    log = _hub_log(hub)
    assert len(log) == requests, [(r.path, r.status) for r in log]


# -- issue 24's layouts: inspect gives the local JSON, migrate the local output's bytes -------------------


@pytest.mark.parametrize("store", ["s3", "hf"])
@pytest.mark.parametrize("name", LAYOUTS)
def test_sharded_layouts_behind_a_url_give_the_local_answers(request, run_cli, tmp_path, store: str,
                                                             name: str) -> None:
    from test_remote_training import _digest

    server = request.getfixturevalue("s3" if store == "s3" else "hub")
    url = f"s3://ckpts/{name}/" if store == "s3" else f"hf://org/repo/{name}/"
    local = run_cli("inspect", "--json", str(FIXTURES / name))
    remote = run_cli("inspect", "--json", url)
    assert remote.code == 0, remote
    assert _training_doc(remote.out) == _training_doc(local.out)
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    local_out, remote_out = tmp_path / "local" / "model.safetensors", tmp_path / "remote" / "model.safetensors"
    assert run_cli("migrate", str(FIXTURES / name), "-o", str(local_out)).code == 0
    server.clear()
    workers = ["--workers", "2"] if name == "ranks/verl" else []  # each worker process reads the URL itself
    r = run_cli("migrate", "--json", url, "-o", str(remote_out), *workers)
    assert r.code == 0, r
    assert all(json.loads(r.out)["verified"].values())
    assert _digest(remote_out) == _digest(local_out)
    # huggingface_hub's own look at the repository is not ckpt's request (docs/remote.md)
    log = _s3_log(server, "/ckpts") if store == "s3" else [q for q in _hub_log(server)
                                                            if q.path != "/api/models/org/repo"]
    assert json.loads(r.out)["remote"]["requests"] == len(log) > 0, log
