"""Byte-level builders for the hostile corpus: torch zips, zips by hand, pickles, tars, safetensors.

Everything is deterministic: fixed seeds, fixed member order, no timestamps
that change between runs (zipfile entries get a fixed date).
"""
from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from typing import Any

FIXED_DATE = (2020, 1, 1, 0, 0, 0)


# ------------------------------------------------------------------ stand-ins
#
# torch.save can only pickle a call to a function it can find by name. To put a
# call to ``module.name`` in a real torch.save file (whatever module.name is: a
# bound method, a __main__ class, a module that does not exist), the object is
# pickled as a call to a stand-in and the stand-in's GLOBAL line is rewritten in
# the protocol-2 pickle (GLOBAL is newline-terminated, so lengths may change).


def stand_in(*args: Any) -> Any:  # pragma: no cover - never called
    raise RuntimeError("stand-in: never called while building the corpus")


class StandInClass:
    """Pickled by class reference (protocol 2: GLOBAL + NEWOBJ/BUILD), renamed afterwards."""

    def __init__(self, **state: Any) -> None:
        self.__dict__.update(state)


class Call:
    """Pickles as ``stand_in(*args)``; :func:`rename_global` then points it anywhere."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (stand_in, self.args)


class Reduce:
    """Pickles as ``func(*args)`` for a func pickle can name itself."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func = func
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)


def _global_line(obj: Any) -> bytes:
    return f"c{obj.__module__}\n{obj.__qualname__}\n".encode()


def stack_global(pkl: bytes, module: str, name: str, stand: Any = stand_in) -> bytes:
    """Like :func:`rename_global` but as STACK_GLOBAL under a protocol-4 header (dotted names resolve)."""
    old = _global_line(stand)
    if old not in pkl or not pkl.startswith(b"\x80\x02"):
        raise ValueError("not a protocol-2 pickle with the stand-in")
    return b"\x80\x04" + pkl[2:].replace(old, short_unicode(module) + short_unicode(name) + b"\x93")


def rename_global(pkl: bytes, module: str, name: str, stand: Any = stand_in) -> bytes:
    """Replace the GLOBAL of ``stand`` (a protocol <= 3 pickle) with ``module.name``."""
    old = _global_line(stand)
    if old not in pkl:
        raise ValueError(f"no GLOBAL {old!r} in the pickle")
    return pkl.replace(old, f"c{module}\n{name}\n".encode())


# ------------------------------------------------------------------ torch zips


def tsave(obj: Any, **kwargs: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


def zip_members(raw: bytes) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member, in directory order (zipfile: checks CRCs)."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


_AUTO_RECORDS = {"version", "byteorder", ".data/serialization_id"}


def torch_zip_records(raw: bytes) -> dict[str, bytes]:
    """The records of a torch zip by name without the archive prefix."""
    return {name.split("/", 1)[1]: data for name, data in zip_members(raw)}


def write_torch_zip(records: dict[str, bytes]) -> bytes:
    """Write records with torch's own writer (64-byte aligned, prefix 'archive/')."""
    import torch

    buf = io.BytesIO()
    w = torch._C.PyTorchFileWriter(buf)
    for name, data in records.items():
        if name in _AUTO_RECORDS:
            continue
        w.write_record(name, data, len(data))
    w.write_end_of_file()
    return buf.getvalue()


def patch_data_pkl(raw: bytes, patch: Callable[[bytes], bytes]) -> bytes:
    records = torch_zip_records(raw)
    records["data.pkl"] = patch(records["data.pkl"])
    return write_torch_zip(records)


def torch_save_calling(obj: Any, module: str, name: str) -> bytes:
    """torch.save(obj) where every :class:`Call` in obj becomes a call to ``module.name``."""
    return patch_data_pkl(tsave(obj, pickle_protocol=2), lambda p: rename_global(p, module, name))


def py_zip(members: Iterable[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED,
           force_zip64: bool = False, comment: bytes = b"") -> bytes:
    """A zip written by Python's zipfile (no alignment), members as given."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, FIXED_DATE)
            info.compress_type = compression
            with z.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)
        z.comment = comment
    return out.getvalue()


def rename_members(raw: bytes, rename: Callable[[str], str], compression: int = zipfile.ZIP_STORED) -> bytes:
    return py_zip([(rename(n), d) for n, d in zip_members(raw)], compression)


def entry_offsets(raw: bytes, name: str) -> tuple[int, int]:
    """(local header offset, central directory entry offset) of member ``name``."""
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        local = z.getinfo(name).header_offset
    pos = raw.find(b"PK\x01\x02")
    while pos >= 0:
        nlen = struct.unpack_from("<H", raw, pos + 28)[0]
        if raw[pos + 46: pos + 46 + nlen] == name.encode():
            return local, pos
        pos = raw.find(b"PK\x01\x02", pos + 1)
    raise ValueError(name)


def set_flag_bits(raw: bytes, name: str, bits: int) -> bytes:
    """OR general-purpose flag bits into the local and central entry of ``name``."""
    out = bytearray(raw)
    local, central = entry_offsets(raw, name)
    for off in (local + 6, central + 8):
        struct.pack_into("<H", out, off, struct.unpack_from("<H", out, off)[0] | bits)
    return bytes(out)


def set_local_sizes(raw: bytes, name: str, delta: int) -> bytes:
    """Make the local header's sizes of ``name`` disagree with the central directory."""
    out = bytearray(raw)
    local, _ = entry_offsets(raw, name)
    for off in (local + 18, local + 22):
        struct.pack_into("<L", out, off, struct.unpack_from("<L", out, off)[0] + delta)
    return bytes(out)


def set_compression_method(raw: bytes, name: str, method: int) -> bytes:
    """Claim a compression method the data is not in (local and central)."""
    out = bytearray(raw)
    local, central = entry_offsets(raw, name)
    struct.pack_into("<H", out, local + 8, method)
    struct.pack_into("<H", out, central + 10, method)
    return bytes(out)


# ------------------------------------------------------------------ pickles


def short_unicode(text: str) -> bytes:
    raw = text.encode()
    return (b"\x8c" + bytes([len(raw)]) + raw) if len(raw) < 256 else (b"X" + struct.pack("<I", len(raw)) + raw)


def proto0_call(module: str, name: str, *args: str) -> bytes:
    """``module.name(*args)``: GLOBAL + REDUCE with text opcodes only (no protocol header)."""
    body = "".join(f"V{a}\n" for a in args)
    return f"c{module}\n{name}\n({body}tR.".encode()


def proto0_obj(module: str, name: str, arg: str) -> bytes:
    """The OBJ opcode: MARK, class, args, ``o`` calls class(*args)."""
    return f"(c{module}\n{name}\nV{arg}\no.".encode()


def stack_global_call(module: str, name: str, arg: str) -> bytes:
    return b"\x80\x04" + short_unicode(module) + short_unicode(name) + b"\x93" + short_unicode(arg) + b"\x85R."


def dumps(obj: Any, protocol: int = 2) -> bytes:
    return pickle.dumps(obj, protocol=protocol)


# ------------------------------------------------------------------ torch 0.1 tar format


class PersRef:
    def __init__(self, key: Any) -> None:
        self.key = key


class _PersPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.key if isinstance(obj, PersRef) else None


def pers_dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _PersPickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def legacy_tar(tensors: dict[str, list[float]], *, storages_pickle_prefix: bytes = b"",
               pickle_member: bytes | None = None, omit: Iterable[str] = (),
               extra: Iterable[tuple[str, bytes]] = ()) -> bytes:
    """The torch 0.1 tar format, as torch.serialization._legacy_load's tar branch reads it.

    Members: ``sys_info`` (not read by torch 2.x), ``storages`` (count, then per
    storage a pickled ``(key, location, storage_type)`` and the raw storage: int64
    element count + float32 data), ``tensors`` (count, then per tensor a pickled
    ``(key, storage_key, type)``, int32 ndim + 4 pad bytes, sizes, strides and
    storage offset as int64) and ``pickle`` (the object, tensors as persistent ids).
    """
    import torch

    storages = io.BytesIO()
    storages.write(storages_pickle_prefix)
    storages.write(dumps(len(tensors)))
    tens = io.BytesIO()
    tens.write(dumps(len(tensors)))
    refs: dict[str, PersRef] = {}
    for i, (key, values) in enumerate(tensors.items()):
        skey, tkey = 2 * i, 2 * i + 1
        storages.write(dumps((skey, "cpu", torch.FloatStorage)))
        storages.write(struct.pack("<q", len(values)) + struct.pack(f"<{len(values)}f", *values))
        tens.write(dumps((tkey, skey, torch.FloatTensor)))
        tens.write(struct.pack("<i", 1) + b"\0" * 4)
        tens.write(struct.pack("<q", len(values)) + struct.pack("<q", 1) + struct.pack("<q", 0))
        refs[key] = PersRef(str(tkey))
    storages.write(dumps([]))  # storage views
    members = [(name, data) for name, data in [
        ("sys_info", dumps({"protocol_version": 1000, "little_endian": True,
                            "type_sizes": {"short": 2, "int": 4, "long": 8}})),
        ("storages", storages.getvalue()),
        ("tensors", tens.getvalue()),
        ("pickle", pickle_member if pickle_member is not None else pers_dumps(refs)),
    ] if name not in omit] + list(extra)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1577836800
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# ------------------------------------------------------------------ safetensors


def safetensors_bytes(header: dict[str, Any] | bytes | str, data: bytes, *, length: int | None = None,
                      pad: bool = True) -> bytes:
    """A safetensors file from a header (dict, or raw JSON text/bytes kept exactly)."""
    if isinstance(header, dict):
        text = json.dumps(header, separators=(",", ":")).encode()
    elif isinstance(header, str):
        text = header.encode("utf-8", "surrogatepass")
    else:
        text = header
    if pad and len(text) % 8:
        text += b" " * (8 - len(text) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)
