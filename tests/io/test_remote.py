"""URLs wherever a path is accepted: the same answers as local files, in a few range requests.

Every server runs on 127.0.0.1, started here and stopped here (tests/helpers/remote_servers.py);
request and byte counts are asserted from the server's own log, never from ckpt's report.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

from tests.helpers.errors import assert_one_line_error

pytest.importorskip("fsspec")
pytest.importorskip("huggingface_hub")
pytest.importorskip("aiohttp")

from tests.helpers.remote_servers import RangeServer, comparable_doc

# Each format of the committed fixtures, with the request limits the issue sets (metadata only).
FORMATS = {
    "tiny_mlp.safetensors": 2,
    "tiny_mlp.pth": 4,
    "training.pth": 4,
    "legacy.pth": 4,
    "torchscript.pt": 4,
    "whole_model.pth": 4,
    "numpy_dict.pkl": 2,
    "sharded/model.safetensors.index.json": 3,  # the index, then one per shard
    "sharded/": 5,  # a look for .metadata, a listing, the index, one per shard
    "sharded_bin/": 5,
    "dcp/": 1,  # .metadata alone: the non-tensor entries stay in their shard files, described, not read
}




@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed fixtures plus a few generated files the limits need (big pickles, big data, NaN)."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("served")
    for name in ("tiny_mlp.safetensors", "tiny_mlp.pth", "training.pth", "legacy.pth", "torchscript.pt",
                 "whole_model.pth", "numpy_dict.pkl"):
        shutil.copy(FIXTURES / name, root / name)
    for folder in ("sharded", "sharded_bin", "dcp", "dcp_multi", "deepspeed"):
        shutil.copytree(FIXTURES / folder, root / folder)
    gen = torch.Generator().manual_seed(0)
    many = {f"blocks.{i}.weight": torch.randn(4, generator=gen) for i in range(3000)}  # data.pkl > 64 KiB
    torch.save(many, root / "many.pth")
    big = {"embed.weight": torch.randn(3_000_000, generator=gen), "head.bias": torch.randn(8, generator=gen)}
    save_file(big, str(root / "big.safetensors"))  # 12 MB of data behind a small header
    torch.save(big, root / "big.pth")
    nan = {"w": torch.tensor([1.0, float("nan"), 3.0]), "b": torch.ones(2)}
    torch.save(nan, root / "nan.pth")
    return root


@pytest.fixture(scope="module")
def http(served: Path):
    with RangeServer(served) as server:
        yield server


@pytest.fixture
def server(http: RangeServer):
    http.clear()
    http.changes.clear()
    http.deny.clear()
    http.ignore_if_match = False
    yield http


def _gets(server: RangeServer) -> list:
    return [r for r in server.requests() if not r.path.startswith("/api/agent-harnesses")]


# -- the same answers as local files ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_inspect_url_gives_the_local_json_within_the_request_limit(run_cli, served: Path, server: RangeServer,
                                                                    name: str) -> None:
    local = run_cli("inspect", "--json", str(served / name))
    assert local.code == 0, local
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/{name}")
    assert remote.code == 0, remote
    got, want = comparable_doc(remote.out), comparable_doc(local.out)
    if name == "dcp/":  # plain HTTP lists no sizes: the shard files are not counted (docs/remote.md)
        got.pop("file_bytes")
        want.pop("file_bytes")
    assert got == want
    log = _gets(server)
    assert 1 <= len(log) <= FORMATS[name], [(r.path, r.range) for r in log]
    assert all(r.status in (200, 206) or r.path.endswith("/.metadata") for r in log)  # a folder: DCP?
    report = json.loads(remote.out)["remote"]
    assert report == {"requests": len(log), "bytes": sum(r.nbytes for r in log if r.status == 206)}
    if name == "dcp/":
        assert [(r.path, r.status) for r in log] == [("/dcp/.metadata", 206)]


@pytest.mark.parametrize("folder", ["dcp_multi/fsdp2", "dcp_multi/model_only", "dcp_multi/accelerate/optimizer_0"])
def test_a_dcp_folder_with_non_tensor_entries_costs_one_request(run_cli, server: RangeServer, folder: str) -> None:
    """Multi-rank folders whose shards hold an optimizer's bytes items (lr, betas, params): .metadata only."""
    local = run_cli("inspect", "--json", str(FIXTURES / folder))
    server.clear()
    remote = run_cli("inspect", "--json", f"{server.url}/{folder}/")
    assert remote.code == 0, remote
    got, want = comparable_doc(remote.out), comparable_doc(local.out)
    got.pop("file_bytes")
    want.pop("file_bytes")
    assert got == want
    log = _gets(server)
    assert [(r.path, r.status) for r in log] == [(f"/{folder}/.metadata", 206)]
    size = (FIXTURES / folder / ".metadata").stat().st_size
    assert json.loads(remote.out)["remote"] == {"requests": 1, "bytes": size}


def test_local_json_has_no_remote_key(run_cli, served: Path, tmp_path: Path) -> None:
    r = run_cli("inspect", "--json", str(served / "tiny_mlp.pth"))
    assert "remote" not in json.loads(r.out)
    r = run_cli("migrate", "--json", str(served / "tiny_mlp.pth"), "-o", str(tmp_path / "out.safetensors"))
    assert r.code == 0 and "remote" not in json.loads(r.out)


def test_safetensors_header_of_a_large_file_is_one_small_request(run_cli, served: Path,
                                                                  server: RangeServer) -> None:
    r = run_cli("inspect", "--json", f"{server.url}/big.safetensors")
    assert r.code == 0, r
    log = _gets(server)
    assert len(log) == 1 and log[0].range == "bytes=0-65535"
    assert server.sent() == 65536 < (served / "big.safetensors").stat().st_size // 100


def test_torch_zip_reads_tail_and_pickle_only(run_cli, served: Path, server: RangeServer) -> None:
    """EOCD and central directory in one tail request; data.pkl in the first block (2 requests)."""
    r = run_cli("inspect", "--json", f"{server.url}/big.pth")
    assert r.code == 0, r
    assert len(_gets(server)) == 2
    assert server.sent() < 200_000 < (served / "big.pth").stat().st_size


def test_a_large_pickle_and_directory_cost_one_more_request_each(run_cli, served: Path,
                                                                 server: RangeServer) -> None:
    """3,000 tensors: the central directory is past the tail block, data.pkl past the first block."""
    r = run_cli("inspect", "--json", f"{server.url}/many.pth")
    assert r.code == 0, r
    log = _gets(server)
    assert len(log) == 4, [(x.range, x.nbytes) for x in log]
    assert server.sent() < 2 * (served / "many.pth").stat().st_size // 3
    assert json.loads(r.out)["tensor_count"] == 3000


def test_shards_are_read_concurrently(run_cli, server: RangeServer) -> None:
    server.delay = 0.5  # each answer waits: answers that overlap were requested together
    try:
        r = run_cli("inspect", "--json", f"{server.url}/sharded/model.safetensors.index.json")
    finally:
        server.delay = 0.0
    assert r.code == 0, r
    shards = [x for x in _gets(server) if "-of-" in x.path]
    assert len(shards) == 2
    a, b = shards
    assert a.started < b.ended and b.started < a.ended  # their answers overlapped in time


def test_verbose_prints_the_counts_on_stderr(run_cli, server: RangeServer) -> None:
    r = run_cli("inspect", "-v", f"{server.url}/tiny_mlp.pth")
    assert r.code == 0, r
    log = _gets(server)
    assert f"remote: {len(log)} requests" in r.err
    assert f"({sum(x.nbytes for x in log if x.status == 206)} bytes)" in r.err


@pytest.mark.parametrize("command", ["inspect", "diff", "gate", "scan", "migrate"])
def test_every_command_reports_its_requests_in_json_and_with_verbose(run_cli, served: Path, server: RangeServer,
                                                                     tmp_path: Path, command: str) -> None:
    """`remote: {requests, bytes}` in --json and `-v` on stderr, both equal to what the server answered."""
    name = "tiny_mlp.pth" if command == "gate" else "training.pth"  # training.pth fails the weights-only check
    url = f"{server.url}/{name}"
    extra = {"diff": [str(served / name)], "migrate": ["-o", str(tmp_path / "out.pth")]}.get(command, [])
    r = run_cli(command, "--json", url, *extra)
    assert r.code == 0, r
    log = _gets(server)
    want = {"requests": len(log), "bytes": sum(x.nbytes for x in log if x.status == 206)}
    assert json.loads(r.out)["remote"] == want
    if command == "migrate":
        extra = ["-o", str(tmp_path / "again.pth")]
    server.clear()
    r = run_cli(command, "-v", url, *extra)
    assert r.code == 0, r
    log = _gets(server)
    assert f"remote: {len(log)} requests" in r.err
    assert f"({sum(x.nbytes for x in log if x.status == 206)} bytes) fetched" in r.err


# -- errors: one line, exit 2 ------------------------------------------------------------


def test_not_found(run_cli, server: RangeServer) -> None:
    r = run_cli("inspect", f"{server.url}/missing.pth")
    assert_one_line_error(r, "missing.pth", "no such file")


def test_access_denied(run_cli, server: RangeServer) -> None:
    server.deny.add("/tiny_mlp.pth")
    r = run_cli("inspect", f"{server.url}/tiny_mlp.pth")
    assert_one_line_error(r, "access denied", "HTTP 403")


def test_a_file_that_changes_between_requests_is_refused(run_cli, served: Path, server: RangeServer) -> None:
    server.changes["/big.pth"] = (1, (served / "tiny_mlp.pth").read_bytes())
    r = run_cli("inspect", f"{server.url}/big.pth")
    assert_one_line_error(r, "changed while it was being read", "HTTP 412")


def test_a_size_change_is_refused_when_the_server_ignores_if_match(run_cli, served: Path,
                                                                    server: RangeServer) -> None:
    server.ignore_if_match = True
    server.changes["/big.pth"] = (1, (served / "big.pth").read_bytes() + b"\0" * 100)
    r = run_cli("inspect", f"{server.url}/big.pth")
    assert_one_line_error(r, "changed while it was being read")


def test_timeouts_are_retried_then_reported(run_cli, server: RangeServer, monkeypatch) -> None:
    monkeypatch.setenv("CKPT_REMOTE_TIMEOUT", "0.3")
    monkeypatch.setenv("CKPT_REMOTE_RETRIES", "1")
    server.delay = 1.0
    try:
        r = run_cli("inspect", f"{server.url}/tiny_mlp.pth")
    finally:
        server.delay = 0.0
    assert_one_line_error(r, "timed out", "CKPT_REMOTE_TIMEOUT")
    # the first try and one retry (a read-ahead part of an earlier test may still land in the log: not counted)
    assert len([g for g in _gets(server) if g.path == "/tiny_mlp.pth"]) == 2


def test_unsafe_needs_a_local_file(run_cli, server: RangeServer) -> None:
    r = run_cli("inspect", "--unsafe", f"{server.url}/tiny_mlp.pth")
    assert_one_line_error(r, "--unsafe", "local")
    assert _gets(server) == []


def test_credentials_in_a_url_are_never_printed(run_cli, server: RangeServer) -> None:
    url = server.url.replace("http://", "http://user:s3cret@") + "/missing.pth?X-Amz-Signature=abcdef"
    r = run_cli("inspect", url)
    assert r.code == 2
    assert "s3cret" not in r.err + r.out and "abcdef" not in r.err + r.out


def test_missing_extra_is_one_line_naming_it(run_cli, monkeypatch) -> None:
    for name in [m for m in list(sys.modules) if m == "huggingface_hub" or m.startswith("huggingface_hub.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub now fails
    r = run_cli("inspect", "https://127.0.0.1:9/x.safetensors")
    assert_one_line_error(r, "pip install 'ckpt-tool[remote]'")


# -- a server that ignores Range ------------------------------------------------------------


@pytest.fixture(scope="module")
def no_range(served: Path):
    with RangeServer(served, ranges=False) as server:
        yield server


def test_no_range_server_is_refused_without_download(run_cli, served: Path, no_range: RangeServer) -> None:
    no_range.clear()
    r = run_cli("inspect", f"{no_range.url}/big.safetensors")
    assert_one_line_error(r, "ignores byte-range requests", "--download")
    size = (served / "big.safetensors").stat().st_size
    assert no_range.sent() < size // 2  # the body was not downloaded


def test_no_range_server_with_download(run_cli, served: Path, no_range: RangeServer) -> None:
    no_range.clear()
    r = run_cli("inspect", "--json", "--download", f"{no_range.url}/big.safetensors")
    assert r.code == 0, r
    local = run_cli("inspect", "--json", str(served / "big.safetensors"))
    assert comparable_doc(r.out) == comparable_doc(local.out)


# -- data paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dcp/", "sharded/", "legacy.pth", "training.pth"])
def test_stats_of_every_format_over_http(run_cli, served: Path, server: RangeServer, name: str) -> None:
    local = run_cli("inspect", "--json", "--stats", str(served / name))
    remote = run_cli("inspect", "--json", "--stats", f"{server.url}/{name}")
    assert remote.code == 0, remote
    got, want = comparable_doc(remote.out), comparable_doc(local.out)
    if name == "dcp/":
        got.pop("file_bytes")
        want.pop("file_bytes")
    assert got == want


def test_stats_over_http_equal_local(run_cli, served: Path, server: RangeServer) -> None:
    local = run_cli("inspect", "--json", "--stats", str(served / "big.pth"))
    remote = run_cli("inspect", "--json", "--stats", f"{server.url}/big.pth")
    assert remote.code == 0, remote
    assert comparable_doc(remote.out) == comparable_doc(local.out)
    data = [x for x in _gets(server) if x.nbytes >= 1 << 20]
    assert len(data) >= 2  # the 12 MB tensor came in parallel parts
    assert max(x.nbytes for x in data) <= 8 << 20
    starts = sorted(x.started for x in data)
    assert any(x.started < max(y.ended for y in data if y is not x) for x in data)
    assert starts


def test_diff_values_over_http(run_cli, served: Path, server: RangeServer) -> None:
    r = run_cli("diff", "--values", "--json", f"{server.url}/big.pth", str(served / "big.safetensors"))
    assert r.code == 0, r
    doc = json.loads(r.out)
    assert doc["equal"] and doc["remote"]["bytes"] >= (served / "big.pth").stat().st_size * 0.9


def test_gate_finds_nan_over_http(run_cli, server: RangeServer) -> None:
    r = run_cli("gate", "--json", f"{server.url}/nan.pth")
    assert r.code == 1, r
    doc = json.loads(r.out)
    checks = {c["name"]: c for c in doc["files"][0]["checks"]}
    assert not checks["no-nan-inf"]["passed"] and checks["loads-safely"]["passed"]
    assert doc["remote"]["requests"] == len(_gets(server))


def test_gate_size_and_sha256_over_http(run_cli, served: Path, server: RangeServer) -> None:
    import hashlib

    digest = hashlib.sha256((served / "big.pth").read_bytes()).hexdigest()
    r = run_cli("gate", "--json", "--no-nan-check", "--sha256", digest, "--max-size", "1 GiB",
                f"{server.url}/big.pth")
    assert r.code == 0, r
    checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
    assert checks["sha256"]["passed"] and not checks["sha256"]["skipped"]
    size = (served / "big.pth").stat().st_size
    assert checks["file-size"]["passed"] and f"{size:,} bytes" in checks["file-size"]["detail"]


def test_scan_over_http(run_cli, server: RangeServer) -> None:
    r = run_cli("scan", "--json", f"{server.url}/whole_model.pth", f"{server.url}/legacy.pth")
    local = [f["verdict"] for f in json.loads(run_cli("scan", "--json", str(FIXTURES / "whole_model.pth"),
                                                      str(FIXTURES / "legacy.pth")).out)["files"]]
    assert [f["verdict"] for f in json.loads(r.out)["files"]] == local


def test_migrate_from_a_url_to_a_local_file(run_cli, served: Path, server: RangeServer, tmp_path: Path) -> None:
    out = tmp_path / "out.safetensors"
    r = run_cli("migrate", f"{server.url}/big.pth", "-o", str(out), "--json")
    assert r.code == 0, r
    assert all(json.loads(r.out)["verified"].values())
    import torch
    from safetensors.torch import load_file

    want = torch.load(served / "big.pth")
    got = load_file(str(out))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def _late(server: RangeServer, returned: float) -> list:
    """The requests the server began to answer after the command returned (one clock: the same process)."""
    import time

    time.sleep(0.3)  # a request left running would reach the server by now
    return [(r.path, r.range, r.status) for r in _gets(server) if r.started > returned]


@pytest.mark.parametrize("args", [("inspect", "--json", "--stats"), ("gate", "--json")])
def test_no_request_is_made_after_the_command_returns(run_cli, server: RangeServer, monkeypatch, args) -> None:
    """Parts fetched ahead end with the command that asked for them: none reaches the server later."""
    import time

    from ckpt_tool.io.remote import file as remotefile

    monkeypatch.setattr(remotefile, "PART", 256 << 10)  # the 12 MB tensor in 46 parts, read ahead 2 at a time
    server.delay = 0.01
    try:
        r = run_cli(*args, f"{server.url}/big.safetensors")
        returned = time.monotonic()
    finally:
        server.delay = 0.0
    assert r.code == 0, r
    assert _late(server, returned) == []


def test_no_request_of_a_failed_read_is_made_after_the_command_returns(run_cli, served: Path, server: RangeServer,
                                                                       monkeypatch) -> None:
    """A data read that fails (the file changed) leaves parts queued: they are cancelled, not sent later."""
    import time

    from ckpt_tool.io.remote import file as remotefile

    monkeypatch.setattr(remotefile, "PART", 64 << 10)  # the 12 MB tensor in 184 parts, 8 requests at a time
    server.changes["/big.safetensors"] = (6, (served / "big.safetensors").read_bytes())  # a new ETag from the 7th
    server.delay = 0.02
    try:
        r = run_cli("inspect", "--stats", f"{server.url}/big.safetensors")
        returned = time.monotonic()
    finally:
        server.delay = 0.0
    assert_one_line_error(r, "changed while it was being read")
    assert _late(server, returned) == []
    assert len(_gets(server)) < 40  # the queued parts were cancelled, not sent and refused one by one


def test_legacy_storage_counts_are_fetched_together(run_cli, served: Path, server: RangeServer) -> None:
    """A legacy file's storages are located by their 8-byte counts: fetched concurrently, not the data."""
    import torch

    path = served / "legacy-big.pth"
    if not path.exists():
        sd = {f"w{i}": torch.zeros(1_000_000) for i in range(6)}  # 4 MB apart
        torch.save(sd, path, _use_new_zipfile_serialization=False)
    server.clear()
    r = run_cli("inspect", "--json", f"{server.url}/legacy-big.pth")
    assert r.code == 0, r
    assert comparable_doc(r.out) == comparable_doc(run_cli("inspect", "--json", str(path)).out)
    log = _gets(server)
    assert server.sent() < 1 << 20 and len(log) <= 7, [(x.range, x.nbytes) for x in log]


def test_any_fsspec_protocol(run_cli, served: Path) -> None:
    """file:// goes through fsspec's generic path (info, then cat_file ranges)."""
    for name in ("tiny_mlp.pth", "big.safetensors", "dcp/"):
        local = run_cli("inspect", "--json", str(served / name))
        remote = run_cli("inspect", "--json", f"file://{served / name}")
        assert remote.code == 0, remote
        got, want = comparable_doc(remote.out), comparable_doc(local.out)
        if name.endswith("/"):
            got.pop("file_bytes")
            want.pop("file_bytes")
        assert got == want


def test_scan_of_a_folder_url(run_cli, server: RangeServer) -> None:
    r = run_cli("scan", "--json", f"{server.url}/dcp/")
    assert r.code == 0, r
    local = json.loads(run_cli("scan", "--json", str(FIXTURES / "dcp")).out)
    doc = json.loads(r.out)
    assert [(Path(f["path"]).name, f["verdict"], f["format"]) for f in doc["files"]] == \
        [(Path(f["path"]).name, f["verdict"], f["format"]) for f in local["files"]]


def test_download_reads_a_zip_from_a_no_range_server(run_cli, served: Path, no_range: RangeServer) -> None:
    r = run_cli("diff", "--values", "--json", "--download", f"{no_range.url}/big.pth", str(served / "big.pth"))
    assert r.code == 0, r
    assert json.loads(r.out)["equal"]


def test_api_on_urls(served: Path, server: RangeServer) -> None:
    import ckpt_tool

    with ckpt_tool.remote_session() as counted:
        report = ckpt_tool.inspect(f"{server.url}/tiny_mlp.pth")
        ckpt = ckpt_tool.load(f"{server.url}/big.safetensors")
    assert report.remote == {"requests": 1, "bytes": (served / "tiny_mlp.pth").stat().st_size}
    assert counted.requests == len(_gets(server)) == 2
    import torch

    from ckpt_tool.tensors.data import tensor_bytes

    want = torch.load(served / "big.pth")["head.bias"].numpy().tobytes()
    assert tensor_bytes(ckpt.by_key["head.bias"]) == want  # data read after the session ended


def test_local_commands_import_nothing_remote() -> None:
    import subprocess

    code = ("import sys, contextlib, io; from ckpt_tool.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['inspect', sys.argv[1]])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 'huggingface_hub', 's3fs', "
            "'aiohttp') or m in ('ckpt_tool.io.remote.session', 'ckpt_tool.io.remote.file', "
            "'ckpt_tool.io.remote.protocols', "
            "'ckpt_tool.io.remote.fetchers')))")
    out = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "tiny_mlp.pth")], capture_output=True,
                         text=True, cwd=str(FIXTURES.parent), check=True).stdout
    assert out.strip() == "[]"


def test_sharded_folder_on_a_server_without_listings(run_cli, served: Path) -> None:
    with RangeServer(served, listings=False) as bare:
        r = run_cli("inspect", "--json", f"{bare.url}/sharded/")
        assert r.code == 0, r
        assert comparable_doc(r.out) == comparable_doc(run_cli("inspect", "--json", str(served / "sharded")).out)
        r = run_cli("inspect", f"{bare.url}/nothing/")
        assert_one_line_error(r, "nothing")
