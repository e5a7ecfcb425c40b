"""DeepSpeed runs and multi-rank DCP folders behind URLs: the local answers, in a few requests each.

The folders are the committed fixtures (fixtures/deepspeed: DeepSpeed's own
ZeRO 1-3 runs of 2 ranks; fixtures/dcp_multi: 2-rank FSDP2, hand-built and
Accelerate folders), served by tests/helpers/remote_servers.py on 127.0.0.1. Request
counts come from the server's log, never from ckpt's report. s3:// and hf://
cases are in test_remote_stores.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from conftest import FIXTURES

pytest.importorskip("fsspec")
pytest.importorskip("huggingface_hub")
pytest.importorskip("aiohttp")

from tests.helpers.remote_servers import RangeServer, comparable_doc

DS_RUNS = ["zero1_bf16", "zero2_fp32", "zero3_fp32", "zero3_bf16"]
DCP_FOLDERS = ["fsdp2", "model_only", "accelerate/optimizer_0", "accelerate/pytorch_model_fsdp_0"]


@pytest.fixture(scope="module")
def http():
    with RangeServer(FIXTURES) as server:
        yield server


@pytest.fixture
def server(http: RangeServer):
    http.clear()
    yield http


def _log(server: RangeServer) -> list:
    return [r for r in server.requests() if not r.path.startswith("/api/agent-harnesses")]


def training_doc(out: str) -> dict:
    """An inspect document without what names where it was read from (a DeepSpeed run's folder too)."""
    doc = comparable_doc(out)
    doc.pop("file_bytes")  # plain HTTP lists no sizes: a folder's size counts the files read
    info = doc.get("metadata", {}).get("deepspeed")
    if isinstance(info, dict):
        info.pop("folder")
    return doc


def _rank_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith("_states.pt"))


# -- inspect: the local JSON ---------------------------------------------------------------


@pytest.mark.parametrize("run", DS_RUNS)
def test_deepspeed_run_folder_over_http(run_cli, server: RangeServer, run: str) -> None:
    """A run folder: a look for .metadata, its listing, ``latest``, the tag's listing, then every rank
    file once (their first requests together); nothing else."""
    local = run_cli("inspect", "--json", str(FIXTURES / "deepspeed" / run))
    assert local.code == 0, local
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/deepspeed/{run}/")
    assert remote.code == 0, remote
    assert training_doc(remote.out) == training_doc(local.out)
    log = _log(server)
    ranks = _rank_files(FIXTURES / "deepspeed" / run / "global_step1")
    base = f"/deepspeed/{run}/"
    assert sorted(r.path for r in log) == sorted([base + ".metadata", base, base + "latest", base + "global_step1/"]
                                                 + [base + "global_step1/" + n for n in ranks])
    assert json.loads(remote.out)["remote"]["requests"] == len(log) == 4 + len(ranks)


@pytest.mark.parametrize("run", ["zero0_ep2", "zero2_ep2"])
def test_deepspeed_moe_run_over_http_reads_every_file_once(run_cli, server: RangeServer, run: str) -> None:
    """A MoE run (issue 32): the same document as the local folder; every file DeepSpeed's loader opens (model
    states, ZeRO or expp_rank optimizer files, every expert file) is requested, none twice."""
    local = run_cli("inspect", "--json", str(FIXTURES / "deepspeed_moe" / run))
    assert local.code == 0, local
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/deepspeed_moe/{run}/")
    assert remote.code == 0, remote
    assert training_doc(remote.out) == training_doc(local.out)
    files = [r.path for r in _log(server) if r.path.endswith(".pt")]
    assert sorted(set(files)) == sorted(f"/deepspeed_moe/{run}/global_step1/{n}"
                                        for n in _rank_files(FIXTURES / "deepspeed_moe" / run / "global_step1"))
    assert len(files) == len(set(files))


def test_deepspeed_tag_folder_over_http(run_cli, server: RangeServer) -> None:
    folder = FIXTURES / "deepspeed" / "zero2_bf16" / "global_step1"
    local = run_cli("inspect", "--json", str(folder))
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/deepspeed/zero2_bf16/global_step1/")
    assert remote.code == 0, remote
    assert training_doc(remote.out) == training_doc(local.out)
    log = _log(server)
    # .metadata, the listing and ``latest`` (each a look that finds nothing), then the 3 rank files
    assert len(log) == 3 + len(_rank_files(folder)), [(r.path, r.status) for r in log]


@pytest.mark.parametrize("folder", DCP_FOLDERS)
def test_multi_rank_dcp_folder_over_http_is_one_request(run_cli, server: RangeServer, folder: str) -> None:
    local = run_cli("inspect", "--json", str(FIXTURES / "dcp_multi" / folder))
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/dcp_multi/{folder}/")
    assert remote.code == 0, remote
    assert training_doc(remote.out) == training_doc(local.out)
    assert [(r.path, r.status) for r in _log(server)] == [(f"/dcp_multi/{folder}/.metadata", 206)]


# -- consolidation from a URL to a local output ------------------------------------------------------


def _digest(path: Path) -> dict[str, str]:
    """The output's bytes: a .safetensors whole; a .pth member by member (torch writes a random
    serialization_id into every archive); a folder file by file."""
    if path.is_dir():
        return {n: v for p in sorted(path.iterdir()) for n, v in _digest(p).items()}
    if path.suffix == ".pth":
        with zipfile.ZipFile(path) as z:
            return {f"{path.name}:{n.split('/', 1)[1]}": hashlib.sha256(z.read(n)).hexdigest()
                    for n in z.namelist() if not n.endswith("/serialization_id")}
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.mark.parametrize("source,output,extra", [
    ("deepspeed/zero3_fp32", "model.safetensors", []),
    ("deepspeed/zero2_bf16", "model.pth", []),
    ("deepspeed/zero3_bf16", "model.safetensors", ["--workers", "2"]),
    ("dcp_multi/fsdp2", "model.pth", []),  # the optimizer's non-tensor values read from their shards
    ("dcp_multi/model_only", "shards", ["--max-shard-size", "200B", "--workers", "2"]),
    ("dist_safetensors/run", "model.safetensors", []),  # torch's distributed safetensors: slices by header
    ("deepspeed_moe/zero2_ep2", "model.safetensors", ["--workers", "2"]),  # MoE: every expert file (issue 32)
    ("deepspeed_moe/zero0_ep2", "model.pth", []),
    ("ranks/fsdp2_tp", "shards", ["--max-shard-size", "200B", "--workers", "2"]),  # per-rank DTensor files
])
def test_consolidating_a_url_gives_the_local_output(run_cli, server: RangeServer, tmp_path: Path, source: str,
                                                    output: str, extra: list[str]) -> None:
    local_out, remote_out = tmp_path / "local" / output, tmp_path / "remote" / output
    os.makedirs(local_out.parent)
    os.makedirs(remote_out.parent)
    r = run_cli("migrate", "--json", str(FIXTURES / source), "-o", str(local_out), *extra)
    assert r.code == 0, r
    server.clear()
    r = run_cli("migrate", "--json", f"{server.url}/{source}/", "-o", str(remote_out), *extra)
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert all(doc["verified"].values())
    assert _digest(remote_out) == _digest(local_out)
    log = _log(server)
    assert doc["remote"] == {"requests": len(log), "bytes": sum(x.nbytes for x in log if x.status == 206)}
    files = [p for p in (FIXTURES / source).rglob("*") if p.is_file()]
    assert sum(x.nbytes for x in log if x.status == 206) <= 2 * sum(p.stat().st_size for p in files)


def test_a_tensor_parallel_url_is_diffed_and_gated_with_tp_rules(run_cli, server: RangeServer) -> None:
    """Megatron-LM's legacy folder behind a URL, merged by a local --tp-rules file, equals its merged model."""
    folder = FIXTURES / "deepspeed_parallel" / "megatron_legacy"
    url = f"{server.url}/deepspeed_parallel/megatron_legacy/"
    rules = str(folder / "rules.toml")
    r = run_cli("diff", "--json", "--values", url, str(folder / "expected.safetensors"), "--tp-rules", rules)
    assert r.code == 0, r
    assert json.loads(r.out)["equal"] and json.loads(r.out)["values_total"] == 16
    r = run_cli("gate", "--json", url, "--tp-rules", rules)
    assert r.code == 0, r
    assert json.loads(r.out)["passed"]
