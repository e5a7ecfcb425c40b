"""One output from several processes: ``--workers N`` and torchrun ranks (issue 14).

Whatever the number of processes, the output is the same file, byte for
byte, as one process writes; each process verifies what it wrote; a failure
anywhere leaves no output. The sharded layouts of issue 24 (per-rank DTensor
and ShardedTensor files, torch's distributed safetensors, DeepSpeed pipeline,
universal and tensor-parallel runs, Megatron-LM's legacy folders merged by
--tp-rules, Megatron-core torch_dist with --unstack-layers) are read from their
committed fixtures.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
import generate_training as gt  # noqa: E402

from ckpt_tool.commands.migrate import migrate  # noqa: E402
from ckpt_tool.commands.migrate.parallel import workers as consolidate  # noqa: E402

DS = ROOT / "fixtures" / "deepspeed"
DCP = ROOT / "fixtures" / "dcp_multi"
RANKS = ROOT / "fixtures" / "ranks"
PARALLEL = ROOT / "fixtures" / "deepspeed_parallel"
MEGATRON_RULES = PARALLEL / "megatron_legacy" / "rules.toml"
# issue 24's layouts, each a reading path of its own: source, migrate's keywords; their fixtures are a few KB,
# so their sharded outputs are cut at 1KB to give every process several shards
LAYOUTS = {
    "verl": (RANKS / "verl", {}),                          # per-rank DTensor files, Shard(0)
    "fsdp2_tp": (RANKS / "fsdp2_tp", {}),                  # Shard(1), Shard(2), Replicate: strided pieces
    "fsdp1": (RANKS / "fsdp1", {}),                        # per-rank ShardedTensor files
    "tp2d": (RANKS / "tp2d", {}),                          # FSDP2 over TP: [_StridedShard(0), Shard(0)], a sub-mesh
    "dist_safetensors": (ROOT / "fixtures" / "dist_safetensors" / "run", {}),  # DCP_SHARDING_INFO slices
    "pipeline": (PARALLEL / "pipeline", {}),               # DeepSpeed layer_XX-model_states.pt
    "universal": (PARALLEL / "universal", {}),             # ds_to_universal's zero/<param>/fp32.pt
    "tp": (PARALLEL / "tp", {}),                           # tp=2 merged by universal_checkpoint_info
    "autotp_zero3": (PARALLEL / "autotp_zero3", {}),       # AutoTP's affine_map: strided blocks, ZeRO-3 ranks
    "megatron_legacy": (PARALLEL / "megatron_legacy", {"tp_rules": str(MEGATRON_RULES)}),  # --tp-rules
    # Megatron-core torch_dist, layers and MoE experts unstacked (fixtures/megatron/generate.py)
    "megatron_moe": (ROOT / "fixtures" / "megatron" / "moe", {"unstack_layers": True}),
}


def _layout(name: str) -> tuple[Path, dict[str, object]]:
    src, keywords = LAYOUTS[name]
    if not src.is_dir():
        pytest.skip(f"{src.relative_to(ROOT)} is not committed here")
    return src, keywords


def _flags(keywords: dict[str, object]) -> list[str]:
    """migrate's keywords as the CLI's options."""
    return (["--tp-rules", str(keywords["tp_rules"])] if "tp_rules" in keywords else []) + (
        ["--unstack-layers"] if keywords.get("unstack_layers") else [])


def _tree(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("z3") / "run"
    groups = [[(f"l{i}.w", (300 + i, 257)) for i in range(9)], [("norm", (257,)), ("odd", (5,))]]
    gt.write_zero3(str(folder), gt.Zero3Spec(groups=groups, world_size=3, shared={"tied": "l0.w"}))
    return folder


@pytest.mark.parametrize("source", ["zero3", "zero2_bf16", "fsdp2", *LAYOUTS])
@pytest.mark.parametrize("out,extra", [("m.safetensors", {}), ("shards", {"max_shard_size": "300KB"})])
def test_workers_write_the_same_bytes_as_one_process(request, tmp_path, source, out, extra):
    if source in LAYOUTS:
        src, keywords = _layout(source)
        extra = {**keywords, **({"max_shard_size": "1KB"} if extra else {})}
    else:
        src = request.getfixturevalue("zero3") if source == "zero3" else (
            DCP / source if source == "fsdp2" else DS / source)
    (tmp_path / "one").mkdir()
    one = migrate(src, tmp_path / "one" / out, workers=1, **extra)
    assert one.ok and one.written
    for n in (2, 3):
        (tmp_path / str(n)).mkdir()
        many = migrate(src, tmp_path / str(n) / out, workers=n, **extra)
        assert many.ok and many.written and many.verified == {"cpu": True}, many.failures
        assert many.shards == one.shards
        assert _tree(tmp_path / str(n) / out) == _tree(tmp_path / "one" / out)


def test_a_byte_flipped_after_writing_is_caught_by_its_worker(tmp_path, zero3):
    def flip(path: str) -> None:
        with open(path, "r+b") as f:
            f.seek(-100, os.SEEK_END)
            b = f.read(1)
            f.seek(-100, os.SEEK_END)
            f.write(bytes([b[0] ^ 1]))

    out = tmp_path / "m.safetensors"
    report = migrate(zero3, out, workers=2, _after_write=flip)
    assert not report.ok and not report.written
    assert any("differ" in f for f in report.failures), report.failures
    assert not out.exists() and not [p for p in tmp_path.iterdir()]


def test_a_worker_that_dies_fails_the_run_and_leaves_nothing(tmp_path, zero3, monkeypatch):
    parent = os.getpid()
    real = consolidate.write_share

    def die_in_a_worker(*args, **kwargs):
        if os.getpid() != parent:
            os._exit(3)
        return real(*args, **kwargs)

    monkeypatch.setattr(consolidate, "write_share", die_in_a_worker)
    if consolidate._context().get_start_method() != "fork":
        pytest.skip("the patch reaches workers only when they are forked")
    from ckpt_tool.errors import CkptError

    with pytest.raises(CkptError, match="exit code 3"):
        migrate(zero3, tmp_path / "m.safetensors", workers=2)
    assert not list(tmp_path.iterdir())


def test_default_workers_follow_the_cores_and_the_size():
    from ckpt_tool.commands.migrate.parallel.choice import choose_workers as choose, default_workers, usable_cores

    assert default_workers(2, 100 << 30) == 1  # 2 cores: one process already keeps both busy
    assert default_workers(3, 100 << 30) == 1
    assert default_workers(4, 100 << 30) == 2
    assert default_workers(16, 100 << 30) == 8
    assert default_workers(64, 100 << 30) == 8  # the disk bounds a durable write before the cores do
    assert default_workers(16, 3 << 30) == 3  # at least 1 GiB each
    assert default_workers(16, (1 << 30) - 1) == 1  # too small to be worth a second process
    assert default_workers(1, 0) == 1
    assert choose(None, "deepspeed", "safetensors", 100 << 30) == default_workers(usable_cores(), 100 << 30)
    assert choose(None, "deepspeed", "safetensors", 1 << 20) == 1
    assert choose(None, "torch-zip", "safetensors", 100 << 30) == 1  # not a consolidation source
    assert choose(4, "torch-zip", "sharded", 1) == 4  # as asked
    assert choose(4, "deepspeed", "torch-zip", 1 << 30) == 1  # a .pth is written by one process


def test_usable_cores_follow_the_affinity_and_the_cgroup_quota(tmp_path):
    from ckpt_tool.commands.migrate.parallel.choice import _cgroup_quota, usable_cores

    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() <= len(os.sched_getaffinity(0))
    cases = {"max 100000\n": None, "200000 100000\n": 2, "150000 100000": 1, "50000 100000": 1, "": None,
             "x 100000": None}
    for i, (text, cores) in enumerate(cases.items()):
        f = tmp_path / f"cpu.max.{i}"
        f.write_text(text)
        assert _cgroup_quota(str(f)) == cores, text
    assert _cgroup_quota(str(tmp_path / "absent")) is None


def test_pth_with_workers_is_written_by_one_process(tmp_path):
    report = migrate(DS / "zero3_fp32", tmp_path / "m.pth", workers=4)
    assert report.ok and report.written


# ------------------------------------------------------------------ torchrun


def _torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "ckpt_tool", "migrate", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("out,extra", [("m.safetensors", []), ("shards", ["--max-shard-size", "300KB"])])
def test_two_torchrun_ranks_write_what_one_process_writes(tmp_path, zero3, out, extra):
    one = migrate(zero3, tmp_path / f"one-{out}", workers=1, max_shard_size=extra[1] if extra else None)
    assert one.ok
    r = _torchrun(str(zero3), "-o", str(tmp_path / out), "--json", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(docs) == 1  # rank 0 reports; rank 1 prints nothing
    doc = json.loads(docs[0])
    assert doc["written"] and doc["verified"] == {"cpu": True}
    assert _tree(tmp_path / out) == _tree(tmp_path / f"one-{out}")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_torchrun_pth_is_written_by_rank_0(tmp_path):
    r = _torchrun(str(DS / "zero2_fp32"), "-o", str(tmp_path / "m.pth"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("wrote:") == 1
    got = torch.load(tmp_path / "m.pth", weights_only=True)
    assert "embed.weight" in got


# the layouts of issue 24 under torchrun: one launch runs every command in turn (torchrun_jobs.py), since each
# launch costs seconds; the sharded outputs check the index and the shares of several files
TORCHRUN_OUT = {"pipeline": "shards", "megatron_legacy": "shards"}


@pytest.fixture(scope="module")
def torchrun_layouts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("torchrun-layouts")
    jobs = []
    for name, (src, keywords) in LAYOUTS.items():
        if not src.is_dir():
            continue
        extra = _flags(keywords)
        if TORCHRUN_OUT.get(name) == "shards":
            extra += ["--max-shard-size", "1KB"]
        jobs.append([name, str(src), "-o", str(out / name / TORCHRUN_OUT.get(name, "m.safetensors")), "--json",
                     *extra])
        (out / name).mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CKPT_DIST_TIMEOUT="120")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(Path(__file__).with_name("torchrun_jobs.py")), str(out), json.dumps(jobs)]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_torchrun_ranks_write_what_one_process_writes_for_every_layout(request, tmp_path, name):
    src, keywords = _layout(name)  # before the launch: a layout not committed here skips without it
    out = TORCHRUN_OUT.get(name, "m.safetensors")
    one = migrate(src, tmp_path / out, workers=1, max_shard_size="1KB" if out == "shards" else None, **keywords)
    assert one.ok and one.written
    ran = request.getfixturevalue("torchrun_layouts")
    codes = [(ran / f"{name}.{rank}.rc").read_text() for rank in (0, 1)]
    assert codes == ["0", "0"], (ran / f"{name}.0.out").read_text()
    assert (ran / f"{name}.1.out").read_text() == ""  # rank 1 writes its share and prints nothing
    doc = json.loads((ran / f"{name}.0.out").read_text())
    assert doc["written"] and doc["verified"] == {"cpu": True}
    assert _tree(ran / name / out) == _tree(tmp_path / out)
    if out == "shards":
        assert len(_tree(tmp_path / out)) > 3  # an index and several shards, shared out between the ranks
    assert [p.name for p in (ran / name).iterdir()] == [out]  # no temporaries left


# ------------------------------------------------------------------ one publish path (issue 33)


def _doc(report, out: Path) -> dict[str, object]:
    """The report's JSON with the output's own name left out."""
    return json.loads(json.dumps(report.to_json()).replace(str(out), "OUT"))


@pytest.mark.parametrize("extra", [{}, {"max_shard_size": "300KB"}, {"verify": False}])
def test_a_cast_that_loses_values_is_reported_as_one_process_reports_it(tmp_path, zero3, extra):
    """Whoever wrote the bytes, the same publish path judges the casts: the same report, nothing left."""
    big = tmp_path / "big.pth"
    torch.save({"w": torch.tensor([1e5, 1.0, -3e5]), "b": torch.ones(4)}, big)
    docs = []
    for n in (1, 2):
        out = tmp_path / str(n) / ("shards" if "max_shard_size" in extra else "m.safetensors")
        out.parent.mkdir()
        report = migrate(big, out, workers=n, dtype="fp16", **extra)
        assert not report.written and not report.ok and report.failures
        assert report.shards == () and report.device_status == {"cpu": "failed"}
        assert list(out.parent.iterdir()) == []  # no output, no temporary
        docs.append(_doc(report, out))
    assert docs[0] == docs[1]


@pytest.mark.parametrize("out", ["m.safetensors", "shards"])
def test_workers_report_what_one_process_reports(tmp_path, zero3, out):
    extra = {"max_shard_size": "300KB"} if out == "shards" else {}
    docs = []
    for n in (1, 3):
        path = tmp_path / str(n) / out
        path.parent.mkdir()
        report = migrate(zero3, path, workers=n, **extra)
        assert report.ok and report.written and report.verified == {"cpu": True}
        docs.append(_doc(report, path))
    assert docs[0] == docs[1]


def test_workers_cast_after_this_process_cast_with_torch(tmp_path, zero3):
    """A second migrate in one process: the forked workers' casts do not wait for the first one's thread pool."""
    from tests.helpers.reliability import watchdog

    one = migrate(zero3, tmp_path / "one.safetensors", workers=1, dtype="bf16")  # torch's threads start here
    assert one.ok and one.written
    with watchdog(120):
        many = migrate(zero3, tmp_path / "many.safetensors", workers=3, dtype="bf16")
    assert many.ok and many.written and many.verified == {"cpu": True}, many.failures
    assert (tmp_path / "many.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()
