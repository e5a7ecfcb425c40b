"""DeepSpeed pipeline, tensor-parallel and universal runs, and Megatron-LM legacy folders, behind a URL (issue 24).

The committed fixtures of fixtures/deepspeed_parallel/ served over HTTP by
tests/helpers/remote_servers.py on 127.0.0.1: migrate of the URL writes the bytes the
local migrate writes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import FIXTURES

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

from tests.helpers.remote_servers import RangeServer


@pytest.fixture(scope="module")
def server():
    with RangeServer(FIXTURES) as s:
        yield s


@pytest.mark.parametrize(("source", "extra"), [
    ("deepspeed_parallel/pipeline", []),
    ("deepspeed_parallel/pipeline_tied", ["--workers", "2"]),
    ("deepspeed_parallel/tp", []),
    ("deepspeed_parallel/universal/global_step1_universal", []),
    ("deepspeed_parallel/universal", []),  # through latest_universal
    ("deepspeed_parallel/megatron_legacy", ["--tp-rules", str(FIXTURES / "deepspeed_parallel" / "megatron_legacy"
                                                               / "rules.toml")]),
])
def test_a_url_gives_the_local_output(run_cli, server: RangeServer, tmp_path: Path, source: str,
                                      extra: list[str]) -> None:
    local, remote = tmp_path / "local.safetensors", tmp_path / "remote.safetensors"
    r = run_cli("migrate", str(FIXTURES / source), "-o", str(local), *extra)
    assert r.code == 0, r
    r = run_cli("migrate", "--json", f"{server.url}/{source}/", "-o", str(remote), *extra)
    assert r.code == 0, r
    assert all(json.loads(r.out)["verified"].values())
    assert hashlib.sha256(remote.read_bytes()).digest() == hashlib.sha256(local.read_bytes()).digest()
