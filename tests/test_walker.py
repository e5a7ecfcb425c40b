"""The static pickle walker: one method per opcode, and the opcode tricks of known advisories."""
from __future__ import annotations

import io
import pickle

import pytest

from ckpt_tool.pickles.scanner import scan_pickle_bytes
from ckpt_tool.pickles.walker import _Walker, walk


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
