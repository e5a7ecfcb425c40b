"""Tensor subclasses over their own storage and tensors with attributes (no third-party library needed):
kept exactly in a .pth, refused by outputs that would drop their class or state; and state_dict entries that
are tensors torch rebuilds in a way ckpt keeps as a record are refused by flat outputs, never dropped."""
from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

TAGGED = """
import sys
import torch

class Tagged(torch.Tensor):
    pass


class Old(Tagged):  # pickled as torch 1.x did: torch._tensor._rebuild_from_type(func, type, args, dict)
    def __reduce_ex__(self, proto):
        func, args = self._reduce_ex_internal(proto)
        return (torch._tensor._rebuild_from_type, (func, type(self), args, dict(vars(self))))


if __name__ == "__main__":
    if sys.argv[1] in ("save", "save_v1"):
        t = torch.arange(6.0).reshape(2, 3).as_subclass(Tagged if sys.argv[1] == "save" else Old)
        t.note = "calibrated"
        torch.save({"w": t, "b": torch.ones(2)}, sys.argv[2])
    else:
        a, b = torch.load(sys.argv[2], weights_only=False), torch.load(sys.argv[3], weights_only=False)
        assert type(b["w"]) is type(a["w"]) and b["w"].note == "calibrated", (type(b["w"]), vars(b["w"]))
        assert torch.equal(a["w"], b["w"]) and torch.equal(a["b"], b["b"])
        print("same")
"""


@pytest.mark.parametrize(("how", "cls"), [("save", "Tagged"), ("save_v1", "Old")])
def test_a_subclass_over_its_own_storage_keeps_class_and_attributes(run_cli, tmp_path, how, cls):
    """``as_subclass`` and attributes: before issue 32 a .pth output wrote it back as a plain tensor, in silence
    (and torch 1.x's ``_rebuild_from_type`` was not read as a tensor at all)."""
    (tmp_path / "tagmod.py").write_text(TAGGED)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    src, out = tmp_path / "tagged.pth", tmp_path / "out.pth"

    def python(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tagmod", *args], check=False, capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=120)

    assert python(how, str(src)).returncode == 0
    doc = json.loads(run_cli("inspect", str(src), "--json").out)
    row = next(t for t in doc["tensors"] if t["key"] == "w")
    assert row["subclass"]["class"] == f"__main__.{cls}" and row["nbytes"] == 24  # saved from `python -m tagmod`
    r = run_cli("migrate", str(src), "-o", str(out))
    assert r.code == 0, r
    loaded = python("check", str(src), str(out))
    assert loaded.returncode == 0 and "same" in loaded.stdout, loaded.stderr[-2000:]
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "o.safetensors"))
    assert r.code == 2 and "'w'" in r.err and f"__main__.{cls}" in r.err, r


def test_a_tensor_with_attributes_stays_a_tensor(run_cli, tmp_path):
    """A plain torch.Tensor carrying attributes (DeepSpeed ZeRO-3's flat groups carry ds_* ones) is read as the
    tensor every reader expects; its attributes are not kept by migrate (said in docs/migrate.md)."""
    t = torch.arange(4.0)
    t.tag = 7
    src, out = tmp_path / "attr.pth", tmp_path / "out.pth"
    torch.save({"t": t, "u": torch.ones(2)}, src)
    doc = json.loads(run_cli("inspect", str(src), "--json").out)
    assert [r["key"] for r in doc["tensors"]] == ["t", "u"] and "subclass" not in doc["tensors"][0]
    assert run_cli("migrate", str(src), "-o", str(out)).code == 0
    assert torch.equal(torch.load(out, weights_only=True)["t"], t)


def test_a_tensor_record_in_the_state_dict_is_never_dropped_by_a_flat_output(run_cli, tmp_path):
    """A value torch rebuilds as a tensor, in a shape ckpt keeps as a record (here a wrapper call torch never
    writes): a safetensors output used to drop it with a warning; it is refused naming the key."""

    class Odd:
        pass

    class Writer(pickle.Pickler):
        def reducer_override(self, obj):  # type: ignore[no-untyped-def]
            if isinstance(obj, Odd):
                return (torch._utils._rebuild_wrapper_subclass, ("odd", 1, 2))
            return NotImplemented

    buf = io.BytesIO()
    Writer(buf, protocol=2).dump({"a": np.ones(3, dtype=np.float32), "b": Odd()})
    src = tmp_path / "odd.pkl"
    src.write_bytes(buf.getvalue())
    r = run_cli("migrate", str(src), "-o", str(tmp_path / "o.safetensors"))
    assert r.code == 2 and "'b'" in r.err, r
    assert not (tmp_path / "o.safetensors").exists()
    assert run_cli("migrate", str(src), "-o", str(tmp_path / "o.safetensors"), "--drop", "b").code == 0
