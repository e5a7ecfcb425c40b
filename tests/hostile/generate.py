"""Deterministic generator of the hostile/unusual corpus: ``build(folder) -> list[Case]``.

Run ``python -m tests.hostile.generate FOLDER`` to write it and list the cases.

Each payload creates its own marker file (``FOLDER/markers/NAME``) when it runs,
so the reference loaders can tell whether loading ran code. ``calls`` are the
``module.name`` references ckpt must name for a case; ``flag`` are references
ckpt must name even though no stock loader runs them (a payload hidden in a
member torch never reads); ``advisory`` names a public advisory the file's
shape matches. None of these are reference verdicts: those are measured.

Deterministic: the same folder gets the same bytes, except legacy-format files
(torch keys their storages by id()) and the TorchScript archive.
"""
from __future__ import annotations

import io
import os
import struct
import sys
import zipfile
from dataclasses import dataclass, field

from . import builders as b
from .cases_benign import add_benign
from .cases_bypass import add_bypasses
from .cases_libraries import add_libraries
from .cases_more import add_more
from .cases_readings import add_readings
from .cases_torchscript import add_torchscript

CLASSES = (
    "zip-structure", "pickle-opcode", "dangerous-call", "nested", "safetensors-header",
    "legacy/tar", "quantized", "folder/special-file", "weights-only-metadata", "clean-control",
    # issue 21: scanner-bypass techniques (tests/hostile/cases_bypass.py) and benign features (cases_benign.py)
    "constructor-call", "trampoline", "gadget", "other-loader", "benign-feature",
    # issue 32: TorchScript code that torch.jit.load runs (tests/hostile/cases_torchscript.py), and files the
    # training libraries' own code writes (tests/hostile/cases_libraries.py)
    "torchscript-code", "benign-library",
)
# Classes whose cases are harmless by construction: ckpt must not flag them (issue 21).
BENIGN_CLASSES = ("benign-feature", "benign-library")


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    cls: str
    note: str
    marker: str | None = None
    calls: tuple[str, ...] = ()
    flag: tuple[str, ...] = ()
    advisory: str | None = None
    kind: str = "file"  # file | folder | special (FIFO, device: never opened by the reference loaders)
    # A refusal that is as good as naming the call: scan exits 2 with an error containing this text
    # (issue 21: a shard an index names outside its folder is an error that says so).
    error_ok: str | None = None
    extra: dict = field(default_factory=dict, compare=False)


class Corpus:
    """Collects cases while writing their files; names are unique."""

    def __init__(self, folder: str) -> None:
        self.folder = os.path.abspath(folder)
        self.markers = os.path.join(self.folder, "markers")
        self.support = os.path.join(self.folder, "support")
        for d in (self.folder, self.markers, self.support):
            os.makedirs(d, exist_ok=True)
        self.cases: list[Case] = []

    def marker(self, name: str) -> str:
        return os.path.join(self.markers, name)

    def touch(self, name: str) -> str:
        return f"touch '{self.marker(name)}'"

    def py_touch(self, name: str) -> str:
        return f"open({self.marker(name)!r}, 'w').close()"

    def add(self, name: str, cls: str, data: bytes | None, note: str, *, ext: str = ".pth",
            payload: bool = False, calls: tuple[str, ...] = (), flag: tuple[str, ...] = (),
            advisory: str | None = None, path: str | None = None, kind: str = "file",
            error_ok: str | None = None) -> Case:
        if cls not in CLASSES:
            raise ValueError(cls)
        if any(c.name == name for c in self.cases):
            raise ValueError(f"duplicate case {name}")
        target = path or os.path.join(self.folder, name + ext)
        if data is not None:
            with open(target, "wb") as f:
                f.write(data)
        case = Case(name, target, cls, note, self.marker(name) if payload else None, calls, flag, advisory, kind,
                    error_ok)
        self.cases.append(case)
        return case


def state_dict() -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    return {"fc.weight": torch.randn(2, 3, generator=g), "fc.bias": torch.zeros(2)}


def build(folder: str) -> list[Case]:
    """Write every case into ``folder`` (created); return them in a stable order."""
    import warnings

    import torch

    torch.manual_seed(0)  # module weights; legacy files still hold id()-based storage keys
    c = Corpus(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations of quantize_per_*, torch.jit, zipfile duplicates
        _dangerous_calls(c)
        _pickle_opcodes(c)
        _nested(c)
        _zip_structure(c)
        add_more(c)
        add_readings(c)
        add_bypasses(c)
        add_benign(c)
        add_torchscript(c)
        add_libraries(c)
    return c.cases


# ------------------------------------------------------------------ dangerous calls


def _dangerous_calls(c: Corpus) -> None:
    sd = state_dict()

    def torch_call(name: str, module: str, func: str, *args: object, note: str) -> None:
        data = b.torch_save_calling({**sd, "hook": b.Call(*args)}, module, func)
        c.add(name, "dangerous-call", data, note, payload=True, calls=(f"{module}.{func}",))

    # torch's own helpers that reach a shell, exec or a nested pickle (one per case)
    torch_call("torch_collect_env_run", "torch.utils.collect_env", "run", c.touch("torch_collect_env_run"),
               note="torch.utils.collect_env.run(cmd): subprocess.Popen(shell=True)")
    torch_call("torch_jit_execwrapper", "torch.jit.unsupported_tensor_ops", "execWrapper",
               c.py_touch("torch_jit_execwrapper"), {}, {},
               note="torch.jit.unsupported_tensor_ops.execWrapper: exec (picklescan GHSA-vr7h-p6mm-wpmh)")
    torch_call("torch_fx_exec_with_source", "torch.fx.graph_module", "_exec_with_source",
               c.py_touch("torch_fx_exec_with_source"), {},
               note="torch.fx.graph_module._exec_with_source(src, globals): exec(compile(src))")
    torch_call("torch_inductor_run_compile_cmd", "torch._inductor.cpp_builder", "_run_compile_cmd",
               c.touch("torch_inductor_run_compile_cmd"), c.support,
               note="torch._inductor.cpp_builder._run_compile_cmd(cmd, cwd): subprocess.run(shlex.split(cmd))")
    script = os.path.join(c.support, "cc.sh")
    with open(script, "w") as f:
        f.write(f"#!/bin/sh\n{c.touch('torch_cpp_extension_check_gcc')}\n")
    os.chmod(script, 0o755)
    torch_call("torch_cpp_extension_check_gcc", "torch.utils.cpp_extension", "check_compiler_is_gcc", script,
               note="torch.utils.cpp_extension.check_compiler_is_gcc(path): runs the 'compiler' it is given")
    ninja_dir = os.path.join(c.support, "ninja")
    os.makedirs(ninja_dir, exist_ok=True)
    with open(os.path.join(ninja_dir, "build.ninja"), "w") as f:
        f.write(f"rule t\n  command = {c.touch('torch_cpp_extension_ninja')}\nbuild out: t\n")
    torch_call("torch_cpp_extension_ninja", "torch.utils.cpp_extension", "_run_ninja_build", ninja_dir, False, "x",
               note="torch.utils.cpp_extension._run_ninja_build(dir, ...): runs ninja on a build.ninja beside it")
    hub_dir = os.path.join(c.support, "hub")
    os.makedirs(hub_dir, exist_ok=True)
    with open(os.path.join(hub_dir, "hubconf.py"), "w") as f:
        f.write(f"{c.py_touch('torch_hub_load_local')}\ndef entry():\n    return 1\n")
    torch_call("torch_hub_load_local", "torch.hub", "_load_local", hub_dir, "entry",
               note="torch.hub._load_local(dir, name): imports dir/hubconf.py")
    inner = b.dumps(b.Reduce(os.system, c.touch("torch_dynamo_config_load_config")))
    torch_call("torch_dynamo_config_load_config", "torch._dynamo.config", "load_config", inner,
               note="torch._dynamo.config.load_config(bytes): a bound method (ConfigModule) that pickle.loads")
    inner = b.dumps(b.Reduce(os.system, c.touch("torch_config_module_load_config")))
    c.add("torch_config_module_load_config", "dangerous-call",
          b.patch_data_pkl(b.tsave({**sd, "hook": b.Call(None, inner)}, pickle_protocol=2),
                           lambda p: b.stack_global(p, "torch.utils._config_module", "ConfigModule.load_config")),
          "ConfigModule.load_config(None, bytes) via STACK_GLOBAL (picklescan GHSA-vv6j-3g6g-2pvj)", payload=True,
          calls=("torch.utils._config_module.ConfigModule.load_config",))
    torch_call("torch_zip_os_system", "os", "system", c.touch("torch_zip_os_system"),
               note="baseline: os.system in data.pkl of a clean torch zip")
    torch_call("torch_zip_builtins_exec", "builtins", "exec", c.py_touch("torch_zip_builtins_exec"),
               note="builtins.exec in data.pkl")
    torch_call("torch_zip_subprocess_check_call", "subprocess", "check_call",
               ["touch", c.marker("torch_zip_subprocess_check_call")], note="subprocess.check_call in data.pkl")
    torch_call("torch_zip_timeit", "timeit", "timeit", "pass", c.py_touch("torch_zip_timeit"),
               note="timeit.timeit(stmt) execs stmt (picklescan GHSA-v7x6-rv5q-mhwc)")
    torch_call("torch_zip_cprofile_runctx", "cProfile", "runctx", c.py_touch("torch_zip_cprofile_runctx"), {}, {},
               note="cProfile.runctx(code, g, l): exec")
    # plain pickles
    c.add("pickle_posix_system", "dangerous-call", b.dumps(b.Reduce(os.system, c.touch("pickle_posix_system"))),
          "os.system as pickle writes it on Linux (posix.system)", ext=".pkl", payload=True,
          calls=("posix.system", "os.system"))
    c.add("pickle_builtins_eval", "dangerous-call",
          b.proto0_call("builtins", "eval", f"__import__('os').system({c.touch('pickle_builtins_eval')!r})"),
          "builtins.eval, protocol 0", ext=".pkl", payload=True, calls=("builtins.eval",))
    c.add("pickle_compat_builtin_eval", "dangerous-call",
          b"\x80\x02" + b.proto0_call("__builtin__", "eval",
                                     f"__import__('os').system({c.touch('pickle_compat_builtin_eval')!r})"),
          "py2 name __builtin__.eval, mapped to builtins.eval by _compat_pickle", ext=".pkl", payload=True,
          calls=("__builtin__.eval", "builtins.eval"))
    c.add("pickle_pkgutil_resolve_name", "dangerous-call",
          b"\x80\x02cpkgutil\nresolve_name\n(Vos:system\ntR(V" + c.touch("pickle_pkgutil_resolve_name").encode()
          + b"\ntR.", "pkgutil.resolve_name('os:system')(cmd) (picklescan GHSA-vvpj-8cmc-gx39)", ext=".pkl",
          payload=True, calls=("pkgutil.resolve_name",))
    c.add("pickle_getattr_import", "dangerous-call",
          b"\x80\x02cbuiltins\ngetattr\n(cbuiltins\n__import__\n(Vos\ntRVsystem\ntR(V"
          + c.touch("pickle_getattr_import").encode() + b"\ntR.",
          "getattr(__import__('os'), 'system')(cmd)", ext=".pkl", payload=True,
          calls=("builtins.getattr", "builtins.__import__"))


# ------------------------------------------------------------------ pickle opcode tricks


def _pickle_opcodes(c: Corpus) -> None:
    sd = state_dict()
    c.add("opcode_inst", "pickle-opcode", f"(V{c.touch('opcode_inst')}\nios\nsystem\n.".encode(),
          "INST opcode instead of GLOBAL+REDUCE", ext=".pkl", payload=True, calls=("os.system",))
    c.add("opcode_obj", "pickle-opcode", b.proto0_obj("os", "system", c.touch("opcode_obj")),
          "OBJ opcode calls the class (here a function) with its args", ext=".pkl", payload=True,
          calls=("os.system",))
    c.add("opcode_stack_global", "pickle-opcode", b.stack_global_call("os", "system", c.touch("opcode_stack_global")),
          "STACK_GLOBAL, protocol 4", ext=".pkl", payload=True, calls=("os.system",))
    from tests.helpers.malicious import computed_stack_global, memo_stack_global, tuple_hidden_stack_global

    c.add("opcode_memo_stack_global", "pickle-opcode",
          memo_stack_global("os", "system", c.touch("opcode_memo_stack_global")),
          "STACK_GLOBAL strings memoized, popped, fetched back", ext=".pkl", payload=True, calls=("os.system",))
    c.add("opcode_tuple_memo", "pickle-opcode",
          tuple_hidden_stack_global("os", "system", c.touch("opcode_tuple_memo")),
          "module name memoized inside a discarded tuple", ext=".pkl", payload=True, calls=("os.system",))
    c.add("opcode_computed_global", "pickle-opcode", computed_stack_global(c.touch("opcode_computed_global")),
          "module name computed at load time (str.join): any dangerous global is enough", ext=".pkl",
          payload=True)
    payload = b.dumps(b.Reduce(os.system, c.touch("payload_then_garbage")))
    c.add("payload_then_garbage", "pickle-opcode", payload[:-1] + b"\xff\xfe garbage that is no pickle",
          "posix.system, then garbage instead of STOP: the payload runs, then the load fails", ext=".pkl",
          payload=True, calls=("posix.system", "os.system"))
    trunc = b.dumps(b.Reduce(os.system, c.touch("payload_then_truncated")))
    c.add("payload_then_truncated", "pickle-opcode", trunc[:-1],
          "posix.system then end of file (no STOP)", ext=".pkl", payload=True, calls=("posix.system", "os.system"))
    c.add("payload_then_bad_opcode", "pickle-opcode",
          b.proto0_call("os", "system", c.touch("payload_then_bad_opcode"))[:-1] + b"\xfb.",
          "os.system then an unknown opcode 0xfb", ext=".pkl", payload=True, calls=("os.system",))
    payload = b.proto0_call("os", "system", c.touch("torch_zip_payload_then_garbage"))[:-1] + b"\x00\x01junk"
    zipped = b.patch_data_pkl(b.tsave(sd), lambda p: payload)
    c.add("torch_zip_payload_then_garbage", "pickle-opcode", zipped,
          "data.pkl: os.system then garbage, inside a torch zip", payload=True, calls=("os.system",))
    # SETITEM/SETITEMS on a non-dict (CVE-2026-24747 shape, fixed in torch 2.10)
    lst = b"](K\x01K\x02e"  # [1, 2]
    for name, body, note in [
        ("setitem_on_list", lst + b"K\x00K\x07s", "SETITEM on a list: l[0] = 7"),
        ("setitems_on_list", lst + b"(K\x00K\x07K\x01K\x08u", "SETITEMS on a list"),
        ("setitem_on_tensor", None, "SETITEM on a tensor: t[0] = 7.0 (writes into tensor memory)"),
    ]:
        if body is None:
            import torch

            raw = b.tsave({"t": torch.zeros(2)}, pickle_protocol=2)
            pkl = b.torch_zip_records(raw)["data.pkl"]
            # after the tensor is rebuilt (REDUCE closing _rebuild_tensor_v2) and memoized, SETITEM on it
            idx = pkl.rindex(b"R")
            extra = b"K\x00G@\x1c\x00\x00\x00\x00\x00\x00s"
            data = b.patch_data_pkl(raw, lambda p, i=idx, extra=extra: p[: i + 1] + extra + p[i + 1:])
        else:
            data = b.patch_data_pkl(b.tsave(sd, pickle_protocol=2),
                                    lambda p, body=body: p[:2] + b"(" + body + b"t0" + p[2:])
        c.add(name, "pickle-opcode", data, note + " inside data.pkl of a torch zip", advisory="CVE-2026-24747")
    # BUILD on a global: torch.load(weights_only=False) sets attributes on torch's own function (module state)
    for name, body, note in [
        ("build_on_global_slots", b"(N}X\x01\x00\x00\x00xK\x01stb0", "slot state: setattr on the function"),
        ("build_on_global_dict", b"}X\x01\x00\x00\x00xK\x01sb0", "dict state: the function's __dict__"),
    ]:
        inject = b"ctorch._utils\n_rebuild_tensor_v2\n" + body
        data = b.patch_data_pkl(b.tsave(sd, pickle_protocol=2), lambda p, i=inject: p[:2] + i + p[2:])
        c.add(name, "pickle-opcode", data, f"BUILD on the global torch._utils._rebuild_tensor_v2 ({note}) "
              "inside data.pkl of a torch zip")
    c.add("setitem_on_tuple", "pickle-opcode", b"\x80\x02K\x01K\x02\x86K\x00K\x07s.",
          "SETITEM on a tuple: every loader refuses", ext=".pkl")
    c.add("append_on_dict", "pickle-opcode", b"\x80\x02}K\x01a.", "APPEND on a dict", ext=".pkl")
    c.add("build_on_int", "pickle-opcode", b"\x80\x02K\x01}b.", "BUILD on an int", ext=".pkl")
    c.add("ext1_opcode", "pickle-opcode", b"\x80\x02\x82\x01.", "EXT1: extension registry code 1 (unregistered)",
          ext=".pkl")
    c.add("persid_in_plain_pickle", "pickle-opcode", b"\x80\x02X\x01\x00\x00\x000Q.",
          "BINPERSID in a plain pickle (no persistent_load)", ext=".pkl")
    c.add("frame_too_long", "pickle-opcode", b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00K\x01.",
          "FRAME claims 255 bytes, 3 follow", ext=".pkl")
    c.add("empty_pickle", "pickle-opcode", b"\x80\x02.", "STOP on an empty stack", ext=".pkl")
    deep = b"]" * 100_000 + b"a" * 99_999
    c.add("metadata_nested_deep", "pickle-opcode",
          b.patch_data_pkl(b.tsave(sd, pickle_protocol=2), lambda p: p[:2] + b"(" + deep + b"t0" + p[2:]),
          "a list nested 100,000 deep built (and discarded) in data.pkl")
    shared = b"\x80\x02]q\x00" + b"(h\x00h\x00h\x00h\x00h\x00h\x00h\x00h\x00h\x00h\x00lq\x00" * 30 + b"."
    c.add("metadata_shared_refs", "pickle-opcode", shared,
          "billion laughs: 30 levels of 10 shared references (tiny file, 10**30 logical items)", ext=".pkl")
    c.add("protocol0_clean_dict", "pickle-opcode", b"(dp0\nVa\np1\nI1\ns.",
          "clean protocol-0 dict: every loader reads it", ext=".pkl")


# ------------------------------------------------------------------ nested archives and members


def _nested(c: Corpus) -> None:
    sd = state_dict()
    clean = b.tsave(sd)
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("nested_pth_member"))}, "os", "system")
    records = b.torch_zip_records(clean)
    c.add("nested_pth_member", "nested", b.write_torch_zip({**records, "inner.pth": evil}),
          "malicious torch zip stored as member archive/inner.pth of a clean one (no loader opens it)",
          flag=("os.system",))
    c.add("extra_member_notes_txt", "nested",
          b.write_torch_zip({**records, "notes.txt": b.proto0_call("os", "system", "touch /nonexistent/x")}),
          "archive/notes.txt: protocol-0 pickle calling os.system (no \\x80, wrong extension)", flag=("os.system",))
    c.add("extra_member_pkl", "nested",
          b.write_torch_zip({**records, "extra.pkl": b.dumps(b.Reduce(os.system, "touch /nonexistent/y"))}),
          "archive/extra.pkl: posix.system in a member torch never reads", flag=("posix.system", "os.system"))
    deepest = evil
    for _ in range(3):
        deepest = b.write_torch_zip({**records, "inner.pth": deepest})
    c.add("nested_pth_depth4", "nested", deepest, "malicious .pth nested 4 archives deep", flag=("os.system",))
    inner = b.dumps(b.Reduce(os.system, c.touch("nested_pickle_loads")))
    c.add("nested_pickle_loads", "nested",
          b.torch_save_calling({**sd, "x": b.Call(inner)}, "pickle", "loads"),
          "pickle.loads of an embedded pickle", payload=True, calls=("pickle.loads", "_pickle.loads"))
    inner_zip = b.tsave({"x": b.Reduce(os.system, c.touch("nested_load_from_bytes"))})
    import torch

    c.add("nested_load_from_bytes", "nested",
          b.tsave({**sd, "w": b.Reduce(torch.storage._load_from_bytes, inner_zip)}),
          "torch.storage._load_from_bytes of a payload zip", payload=True,
          calls=("torch.storage._load_from_bytes", "posix.system", "os.system"))
    st = b.safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b.f32(1, 2))
    c.add("nested_safetensors_member", "nested", b.write_torch_zip({**records, "extra.safetensors": st}),
          "a clean safetensors file stored as a member (inert)")
    c.add("nested_storage_bytes_look_like_pickle", "nested",
          b.write_torch_zip({**records, "data/99": b.proto0_call("os", "system", "touch /nonexistent/z")}),
          "an unreferenced storage record whose bytes look like a protocol-0 os.system pickle",
          flag=("os.system",))


# ------------------------------------------------------------------ zip structure


def _zip_structure(c: Corpus) -> None:
    sd = state_dict()
    clean = b.tsave(sd)
    members = b.zip_members(clean)

    def strip(n: str) -> str:
        return n.split("/", 1)[1]

    c.add("zip_python_writer", "zip-structure", b.py_zip(members), "clean members rewritten by zipfile (unaligned)")
    c.add("zip_empty_prefix", "zip-structure", b.rename_members(clean, lambda n: "/" + strip(n)),
          "members under an empty prefix: /data.pkl")
    c.add("zip_absolute_names", "zip-structure", b.rename_members(clean, lambda n: "/tmp/" + n),
          "absolute member names: /tmp/archive/data.pkl")
    c.add("zip_dotdot_prefix", "zip-structure", b.rename_members(clean, lambda n: "../" + strip(n)),
          "members under '..': ../data.pkl")
    c.add("zip_dotdot_deep", "zip-structure", b.rename_members(clean, lambda n: "../../" + n),
          "members named ../../archive/data.pkl")
    c.add("zip_unicode_prefix", "zip-structure", b.rename_members(clean, lambda n: "模型/" + strip(n)),
          "non-ASCII prefix")
    c.add("zip_no_prefix", "zip-structure", b.rename_members(clean, strip), "no folder at all: data.pkl at the root")
    c.add("zip_backslash_names", "zip-structure", b.rename_members(clean, lambda n: n.replace("/", "\\")),
          "backslashes instead of slashes")
    c.add("zip_mixed_prefixes", "zip-structure",
          b.py_zip([(("a/" if i == 0 else "b/") + strip(n), d) for i, (n, d) in enumerate(members)]),
          "data.pkl under a/, the rest under b/")
    c.add("zip_deflate_all", "zip-structure", b.py_zip(members, zipfile.ZIP_DEFLATED),
          "every member deflate-compressed (storages too)")
    c.add("zip_deflate_storages_only", "zip-structure",
          _mixed_compression(members, lambda n: "/data/" in n), "storage members deflated, data.pkl stored")
    c.add("zip_bzip2", "zip-structure", b.py_zip(members, zipfile.ZIP_BZIP2), "bzip2-compressed members")
    c.add("zip_lzma", "zip-structure", b.py_zip(members, zipfile.ZIP_LZMA), "lzma-compressed members")
    c.add("zip_zip64", "zip-structure", b.py_zip(members, force_zip64=True), "zip64 extra fields on every member")
    c.add("zip_comment", "zip-structure", b.py_zip(members, comment=b"a comment"), "archive comment")
    c.add("zip_trailing_garbage", "zip-structure", clean + b"\0garbage after the end record",
          "bytes after the end-of-central-directory record")
    c.add("zip_prepended_garbage", "zip-structure", b"#!/bin/sh\nexit 0\n" + clean,
          "a shell stub before the zip (zipfile reads it; torch sees no PK magic)")
    pkl_name = next(n for n, _ in members if n.endswith("/data.pkl"))
    c.add("zip_encrypted_flag", "zip-structure", b.set_flag_bits(clean, pkl_name, 0x1),
          "data.pkl entry has the encrypted flag bit set")
    c.add("zip_local_size_mismatch", "zip-structure", b.set_local_sizes(clean, pkl_name, 1),
          "local header sizes of data.pkl differ from the central directory")
    raw = bytearray(clean)
    local, _ = b.entry_offsets(clean, pkl_name)
    struct.pack_into("<H", raw, local + 28, 0xFFFF)
    c.add("zip_local_extra_len_huge", "zip-structure", bytes(raw),
          "local header of data.pkl claims a 65535-byte extra field (its data would start elsewhere)")
    c.add("zip_method_lie", "zip-structure", b.set_compression_method(clean, pkl_name, 8),
          "data.pkl stored but its entries claim deflate")
    raw = bytearray(clean)
    local, central = b.entry_offsets(clean, pkl_name)

    struct.pack_into("<L", raw, local + 14, 0xDEADBEEF)
    struct.pack_into("<L", raw, central + 16, 0xDEADBEEF)
    c.add("zip_bad_crc", "zip-structure", bytes(raw), "CRC32 of data.pkl wrong (torch ignores CRCs)")
    raw = bytearray(clean)
    raw[local + 30: local + 30 + len(pkl_name)] = b"x" * len(pkl_name)
    c.add("zip_local_name_differs", "zip-structure", bytes(raw), "local header name differs from the directory")
    c.add("zip_truncated", "zip-structure", clean[: clean.find(b"PK\x01\x02")], "no central directory")
    c.add("zip_half", "zip-structure", clean[: len(clean) // 2], "cut in the middle")
    c.add("zip_missing_data_pkl", "zip-structure", b.py_zip([m for m in members if m[0] != pkl_name]),
          "no data.pkl")
    c.add("zip_missing_storage", "zip-structure", b.py_zip([m for m in members if "/data/0" not in m[0]]),
          "a storage member missing")
    c.add("zip_short_storage", "zip-structure",
          b.py_zip([(n, d[:4] if n.endswith("/data/0") else d) for n, d in members]),
          "a storage member shorter than the tensor needs")
    c.add("zip_duplicate_data_pkl", "zip-structure",
          b.py_zip([(pkl_name, b.proto0_call("os", "system", c.touch("zip_duplicate_data_pkl"))), *members]),
          "two data.pkl entries: the first calls os.system, the second is clean (zipfile reads the last; torch 2.13 "
          "reads the clean one too, so no stock loader runs it: issue 21 made liveness a test)",
          calls=("os.system",), flag=("os.system",))
    c.add("zip_duplicate_data_pkl_last", "zip-structure",
          b.py_zip([*members, (pkl_name, b.proto0_call("os", "system", c.touch("zip_duplicate_data_pkl_last")))]),
          "two data.pkl entries: the clean one first, the os.system one last (torch 2.13 reads the clean one)",
          calls=("os.system",), flag=("os.system",))
    c.add("zip_uppercase_names", "zip-structure", b.rename_members(clean, lambda n: n.upper()),
          "member names upper-cased (ARCHIVE/DATA.PKL)")
    c.add("zip_version_99", "zip-structure",
          b.py_zip([(n, b"99\n" if n.endswith("/version") else d) for n, d in members]),
          "archive/version says 99")
    c.add("zip_byteorder_big", "zip-structure",
          b.py_zip([(n, b"big" if n.endswith("/byteorder") else d) for n, d in members]),
          "archive/byteorder says big: torch byte-swaps the data")
    c.add("zip_data_pkl_garbage", "zip-structure",
          b.py_zip([(n, b"not a pickle" if n == pkl_name else d) for n, d in members]), "data.pkl is not a pickle")
    c.add("zip_no_members", "zip-structure", b.py_zip([]), "an empty zip")
    c.add("zip_directory_entries", "zip-structure", b.py_zip([("archive/", b""), ("archive/data/", b""), *members]),
          "explicit directory entries before the members")
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("zip_dotdot_payload"))}, "os", "system")
    c.add("zip_dotdot_payload", "zip-structure", b.rename_members(evil, lambda n: "../" + strip(n)),
          "os.system in a zip whose members sit under '..'", payload=True, calls=("os.system",))
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("zip_empty_prefix_payload"))}, "os", "system")
    c.add("zip_empty_prefix_payload", "zip-structure", b.rename_members(evil, lambda n: "/" + strip(n)),
          "os.system in a zip whose members sit under an empty prefix", payload=True, calls=("os.system",))
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("zip_deflate_payload"))}, "os", "system")
    c.add("zip_deflate_payload", "zip-structure", b.py_zip(b.zip_members(evil), zipfile.ZIP_DEFLATED),
          "os.system in a deflated data.pkl", payload=True, calls=("os.system",))
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("zip_encrypted_payload"))}, "os", "system")
    name = next(n for n, _ in b.zip_members(evil) if n.endswith("/data.pkl"))
    c.add("zip_encrypted_payload", "zip-structure", b.set_flag_bits(evil, name, 0x1),
          "os.system in a data.pkl flagged encrypted (torch refuses it: hidden, named all the same)",
          calls=("os.system",), flag=("os.system",))
    evil = b.torch_save_calling({**sd, "x": b.Call(c.touch("zip_prepended_pickle_payload"))}, "os", "system")
    c.add("zip_prepended_pickle_payload", "zip-structure",
          b.dumps(b.Reduce(os.system, c.touch("zip_prepended_pickle_payload"))) + clean,
          "a posix.system pickle prepended to a clean zip (torch reads it as legacy)", payload=True,
          calls=("posix.system", "os.system"))


def _mixed_compression(members, deflate) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members:
            info = zipfile.ZipInfo(n, b.FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED if deflate(n) else zipfile.ZIP_STORED
            z.writestr(info, d)
    return out.getvalue()


if __name__ == "__main__":
    for case in build(sys.argv[1]):
        print(f"{case.cls:22} {case.name:40} {case.note}")
