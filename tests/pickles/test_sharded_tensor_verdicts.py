"""FSDP1's ShardedTensor (SHARDED_STATE_DICT rank files): judged by what torch.save writes, not called dangerous.

torch.save writes ``_rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor, ..., state)`` and reaches
the nested ``ShardedTensor.ProcessGroupState`` through ``getattr(ShardedTensor, "ProcessGroupState")``. With
``init_rrefs`` False, ShardedTensor.__setstate__ only checks the process group's ranks; with it True it joins
the RPC agent, so that file stays dangerous, as does any other use of getattr. Files are written by real torch
in one process (a one-rank gloo group on a HashStore: no port).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ckpt_tool import scan

WRITE = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    spec = ChunkShardingSpec(dim=0, placements=["rank:0/cpu"])
    st = sharded_tensor.rand(spec, 4, 3, init_rrefs=False)
    torch.save({"w": st}, sys.argv[1] + "/plain.pt")
    st._init_rrefs = True  # what __getstate__ writes for a tensor made with init_rrefs=True (needs an RPC agent)
    torch.save({"w": st}, sys.argv[1] + "/rrefs.pt")
    st._init_rrefs = False
    torch.save({"w": st}, sys.argv[1] + "/again.pt")
    print(torch.load(sys.argv[1] + "/plain.pt", weights_only=False)["w"].local_shards()[0].tensor.shape)
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    proc = subprocess.run([sys.executable, "-c", WRITE, str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.Size([4, 3])" in proc.stdout  # torch.load reads it back in a process group
    return out


def _judged(path):
    (f,) = scan([str(path)]).files
    return f, {g.qualname: g.severity.value for g in f.globals}


def test_sharded_tensor_as_torch_save_writes_it_is_safe(files):
    f, judged = _judged(files / "plain.pt")
    assert f.verdict == "safe", (judged, f.findings)
    assert judged["torch.distributed._shard.sharded_tensor.api.ShardedTensor.ProcessGroupState"] == "safe"
    assert judged["__builtin__.getattr"] == "safe"  # it only resolved the catalogued nested class


def test_sharded_tensor_with_rpc_state_stays_dangerous(files):
    f, judged = _judged(files / "rrefs.pt")
    assert f.verdict == "dangerous"
    assert judged["torch.distributed._shard.sharded_tensor.api.ShardedTensor"] == "dangerous"


def _getattr(outer: tuple[str, str], name: str) -> bytes:
    """Protocol 2: getattr(module.Outer, name), as pickle writes a nested class."""
    return (b"c__builtin__\ngetattr\n" + f"c{outer[0]}\n{outer[1]}\n".encode()
            + b"X" + len(name).to_bytes(4, "little") + name.encode() + b"\x86R")


ST = ("torch.distributed._shard.sharded_tensor.api", "ShardedTensor")


def test_getattr_of_anything_else_stays_dangerous(tmp_path):
    nested = _getattr(ST, "ProcessGroupState")
    cases = {
        # getattr(os.path, "join") beside the catalogued use: getattr reaching anything else
        "system": b"\x80\x02(" + nested + _getattr(("os", "path"), "join") + b"t.",
        # the same getattr object kept in a dict (it flows elsewhere than resolving a nested class)
        "escapes": b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01c__builtin__\ngetattr\nq\x02s(h\x02" + nested[
            len(b"c__builtin__\ngetattr\n"):] + b"t.",
        # a name the catalog does not hold under the class
        "other": b"\x80\x02" + _getattr(ST, "Evil") + b".",
        # the catalogued use beside a getattr of an unreviewed nested name: getattr is not vouched for
        "mixed": b"\x80\x02(" + nested + _getattr(("mylab", "Outer"), "Inner") + b"t.",
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.pkl"
        path.write_bytes(data)
        f, judged = _judged(path)
        assert f.verdict == "dangerous", (name, judged, f.findings)
        assert judged["__builtin__.getattr"] == "dangerous", (name, judged)
