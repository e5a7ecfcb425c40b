"""The static pickle walker: one method per opcode, and the opcode tricks of known advisories."""
from __future__ import annotations

import io
import pickle

import pytest

from ckpt_tool.pickles.scanner import scan_pickle_bytes
from ckpt_tool.pickles.walk.walker import _Walker, walk


def _walk(data: bytes):
    return walk(io.BytesIO(data), "x", size=len(data))


def test_every_opcode_cpython_knows_has_a_handler():
    """The dispatch table covers pickle.py's own (protocol 0-5), so no opcode is 'unknown' by omission."""
    from pickletools import opcodes

    missing = [op.name for op in opcodes if _Walker.dispatch[op.code.encode("latin-1")[0]] is None]
    assert not missing


@pytest.mark.parametrize("body, kind", [
    (b"]K\x00K\x01s.", "list"),            # EMPTY_LIST, SETITEM
    (b"](K\x00K\x01u.", "list"),           # EMPTY_LIST, MARK, SETITEMS
    (b"\x8f(K\x00K\x01u.", "set"),          # EMPTY_SET, SETITEMS
    (b")K\x00K\x01s.", "tuple"),           # EMPTY_TUPLE, SETITEM
])
def test_setitem_on_a_non_dict_is_cve_2026_24747(body, kind):
    data = b"\x80\x02" + body
    w = _walk(data)
    messages = [f.message for f in w.findings if f.severity == "dangerous"]
    assert any("CVE-2026-24747" in m and kind in m for m in messages), w.findings
    assert scan_pickle_bytes(data, "x").verdict == "dangerous"


def test_setitem_on_dicts_is_fine():
    data = pickle.dumps({"a": 1, "b": [1, 2], "c": {"d": 3}}, protocol=2)
    w = _walk(data)
    assert w.complete and not w.findings


def test_calls_reached_before_garbage_are_reported():
    payload = b"cposix\nsystem\n(S'true'\ntR" + b"\xff\xfe garbage"
    w = _walk(payload)
    assert not w.complete
    assert [(g.module, g.name, g.severity) for g in w.globals] == [("posix", "system", "dangerous")]
    assert scan_pickle_bytes(payload, "x").verdict == "dangerous"


@pytest.mark.parametrize("module, name, body", [
    ("torch._utils", "_rebuild_tensor_v2", b"(N}X\x01\x00\x00\x00xK\x01stb0"),  # slot state
    ("torch._utils", "_rebuild_tensor_v2", b"}X\x01\x00\x00\x00xK\x01sb0"),  # dict state
    ("torch._utils", "_rebuild_parameter", b"}X\x01\x00\x00\x00xK\x01sb0"),  # a function stand-in
    ("collections", "Counter", b"(N}X\x01\x00\x00\x00xK\x01stb0"),  # a stdlib class written in Python
])
def test_build_on_a_global_is_dangerous_and_changes_nothing(tmp_path, module, name, body):
    """BUILD on a global: every command names it (as scan does); ckpt's shared stand-ins stay as they were."""
    import collections

    import torch
    from hostile import builders as b

    from ckpt_tool import load
    from ckpt_tool.pickles.unpickle import rebuilders

    inject = f"c{module}\n{name}\n".encode() + body
    path = tmp_path / "f.pth"
    path.write_bytes(b.patch_data_pkl(b.tsave({"w": torch.zeros(2)}, pickle_protocol=2),
                                      lambda p: p[:2] + inject + p[2:]))
    stand_in = rebuilders.ALLOWED[(module, name)]
    before = dict(vars(stand_in))
    ck = load(str(path))
    assert dict(vars(stand_in)) == before  # nothing the pickle set outlives its read
    assert not hasattr(collections.Counter, "x")
    assert [t.key for t in ck.tensors] == ["w"]
    assert any(f"BUILD sets attributes on the imported object {module}.{name}" in w for w in ck.warnings)


def test_build_on_a_global_in_a_large_pickle_is_predicted_as_torch_refuses_it(tmp_path):
    """Over wo_input.SMALL_PICKLE the prediction trusts the reader's cheap facts, unless a stand-in changed."""
    import torch
    from hostile import builders as b

    from ckpt_tool.commands.inspect.command import inspect
    from ckpt_tool.pickles.torch_rules.inputs import SMALL_PICKLE

    raw = b.tsave({f"layer{i}.weight": torch.zeros(1) for i in range(3000)}, pickle_protocol=2)
    assert len(b.torch_zip_records(raw)["data.pkl"]) > SMALL_PICKLE
    inject = b"ctorch._utils\n_rebuild_tensor_v2\n}X\x01\x00\x00\x00xK\x01sb"  # left on the stack: STOP ignores it
    path = tmp_path / "big.pth"
    path.write_bytes(b.patch_data_pkl(raw, lambda p: p[:2] + inject + p[2:]))
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    report = inspect(str(path))
    assert report.weights_only.loads is False
    assert any("BUILD sets attributes on the imported object torch._utils._rebuild_tensor_v2" in w
               for w in report.warnings)
