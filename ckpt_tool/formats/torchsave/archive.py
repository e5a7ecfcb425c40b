"""torch.save zip archives and TorchScript archives, read lazily.

Only ``data.pkl`` is read; storages become LazyStorages whose bytes are
located in the archive when (and if) someone reads them.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ... import dtypes
from ...errors import InputError, LimitExceeded
from ...format_names import Format
from ...io.zip import UNSUPPORTED_FLAGS, ZipArchive, zip_source
from ...model import DataSource
from ...pickles import CVE_2025_32434_SCRIPT
from ...pickles.torch_rules import inputs as wo_input
from ...pickles.unpickle import LazyStorage, Placeholder, StorageType, restricted_loads
from ..interface import FormatReader, Loaded, ReadOptions

_UINT8 = dtypes.BY_NAME["uint8"]
_ODD_MEMBER = re.compile(r"(^/|\.\.|\\|^$)")


def archive_prefix(archive: ZipArchive) -> str:
    """The folder torch's reader uses, with its slash: the first entry's name up to its first '/'.

    As torch's PyTorchStreamReader: an empty folder name ("/data.pkl") is a
    folder like any other; a first entry with no '/' at all is refused.
    """
    names = archive.names()
    if not names:
        raise InputError("zip archive has no members", archive.path)
    first = archive.entries[0].name if archive.entries else names[0]
    if "/" not in first:
        raise InputError(f"zip archive is not a torch checkpoint: its first member {first!r} is not in a folder "
                         "(torch.load refuses it: 'file in archive is not in a subdirectory')", archive.path)
    prefix = first.split("/", 1)[0] + "/"
    outside = member_outside(archive, prefix)
    if outside is not None:
        raise InputError(f"zip archive member {outside!r} is not in the archive's folder {prefix!r} (torch.load "
                         f"refuses it: 'file in archive is not in a subdirectory {prefix}: {outside}')", archive.path)
    return prefix


def member_outside(archive: ZipArchive, prefix: str) -> str | None:
    """The first member (duplicates included) outside ``prefix``, as torch 2.13's reader checks every one.

    200,000 names are checked at C speed: joined between newlines, every one
    starts with the folder when the folder follows each newline once per name.
    """
    entries = archive.entries or list(archive.members.values())
    joined = "\n" + "\n".join(m.name for m in entries)
    if joined.count("\n") == len(entries) and joined.count("\n" + prefix) == len(entries):
        return None  # no name holds a newline, and each one starts with the folder
    return next((m.name for m in entries if not m.name.startswith(prefix)), None)


def _join(prefix: str, name: str) -> str:
    return prefix + name


# torch 2.13 reads archive format versions 1..10 (caffe2/serialize/versions.h); the record is
# ``.data/version`` or else ``version``.
MIN_FORMAT_VERSION, MAX_FORMAT_VERSION = 1, 10


def check_version(archive: ZipArchive, prefix: str) -> int:
    """The archive's format version, refused where torch's reader refuses it."""
    name = archive.resolve(prefix + ".data/version") or archive.resolve(prefix + "version")
    if name is None:
        raise InputError(f"zip archive is not a torch checkpoint: no {prefix + 'version'!r} record "
                         "(torch.load refuses it: 'Expected hasRecord(\"version\")')", archive.path)
    text = archive.read(name, 64, "--max-member-bytes").decode("latin-1")
    found = re.match(r"\s*\+?(\d+)", text)
    if found is None:
        raise InputError(f"archive record {name!r} is not a version number: {text[:20]!r}", archive.path)
    version = int(found.group(1))
    if not MIN_FORMAT_VERSION <= version <= MAX_FORMAT_VERSION:
        raise InputError(f"archive format version {version} is outside the {MIN_FORMAT_VERSION}.."
                         f"{MAX_FORMAT_VERSION} torch reads (torch.load refuses it)", archive.path)
    return version


def storage_loader(archive: ZipArchive, prefix: str, source: DataSource, path: str) -> Callable[[Any], LazyStorage]:
    """A persistent_load that turns torch's storage ids into LazyStorages."""
    cache: dict[str, LazyStorage] = {}

    members = archive.members
    duplicates = bool(archive.duplicates)  # fixed once the directory is read
    data_prefix = _join(prefix, "data/")

    def persistent_load(pid: Any) -> LazyStorage:
        if type(pid) is not tuple or len(pid) < 5 or pid[0] != "storage":
            raise InputError(f"unexpected persistent id {str(pid)[:60]!r} in data.pkl", path)
        key = pid[2]
        found = cache.get(key)
        if found is not None:
            return found
        storage_type, location, numel = pid[1], pid[3], pid[4]
        if not isinstance(storage_type, StorageType):
            raise InputError(f"storage {key!r} has an unknown storage type", path)
        dt = storage_type.dtype or _UINT8
        if type(numel) is not int or numel < 0:
            raise InputError(f"storage {key!r} has an invalid size", path)
        member = data_prefix + str(key)
        info = None if duplicates else members.get(member)
        if info is None:  # a case-folded or duplicated name: the member torch's lookup finds
            member = archive.resolve(member) or member
            info = members.get(member)
        if info is None:
            raise InputError(f"storage {key!r} is named in data.pkl but archive member {member!r} is missing", path)
        nbytes = numel * dt.itemsize
        if info.flags & UNSUPPORTED_FLAGS or info.method:  # rare: checked in full only then (200,000 calls)
            archive.check_readable(info)
        if nbytes != info.size:  # torch refuses any mismatch (the CVE-2026-24747 fix checks it since 2.10)
            raise InputError(
                f"storage {key!r} should hold {nbytes} bytes but archive member {member!r} has {info.size} "
                "(torch.load refuses it: record size does not match expected size)", path
            )
        lazy = LazyStorage(member, dt, nbytes, str(location), source)
        cache[key] = lazy
        return lazy

    return persistent_load


def read_torch_zip(path: str, options: ReadOptions) -> Loaded:
    archive = ZipArchive(path, options.limits.max_member_bytes)
    try:
        prefix = archive_prefix(archive)
        version = check_version(archive, prefix)
        pkl = archive.resolve(_join(prefix, "data.pkl"))
        if pkl is None and archive.resolve(_join(prefix, ".data/extern_modules")) is not None:
            raise InputError("a torch.package archive: torch.package.PackageImporter imports and runs the Python "
                             "modules packaged in it (torch.load cannot read it: no data.pkl); ckpt reads no such "
                             "archive, and `ckpt scan` names what it would run", path)
        if pkl is None:
            others = [n for n in archive.names() if n.endswith(".pkl")]
            hint = f" (it holds {', '.join(others[:3])})" if others else ""
            raise InputError(f"zip archive is not a torch checkpoint: no {_join(prefix, 'data.pkl')!r}{hint}", path)
        names = "\n" + "\n".join(archive.members) + "\n"  # substring tests at C speed (200,000 members)
        is_script = _join(prefix, "constants.pkl") in archive.members or ("\n" + _join(prefix, "code/")) in names
        # Stored members are plain file regions (writers copy them in the kernel); only an archive with
        # deflated members needs the inflating source (zip_source: the same over a URL, by range).
        source = zip_source(archive)
        data = archive.read(pkl, options.limits.max_pickle_bytes)
        seen: set[int] = set()  # for the weights_only prediction (pickles/torch_rules/inputs.py)
        result = restricted_loads(
            data, where=pkl, path=path,
            persistent_load=storage_loader(archive, prefix, source, path),
            limits=options.limits, read_blob=options.read_blob, opcodes=seen,
        )
        warnings = _archive_warnings(archive, prefix, names)
        unexpected = None if is_script else _unexpected_members(archive, prefix, names)
        weights_only = wo_input.read(wo_input.TORCHSCRIPT if is_script else wo_input.ZIP, path,
                                     [(data, seen, result.references, pkl)], str(version).encode())
        root = result.obj
        if is_script:
            warnings.append(CVE_2025_32434_SCRIPT)
            root = torchscript_state_dict(archive, prefix, result.obj, path, warnings)
        return Loaded(Format.TORCHSCRIPT if is_script else Format.TORCH_ZIP, root, tuple(result.references),
                      tuple(warnings), (source,), layout="torchscript" if is_script else None,
                      # formats/checkpoint/findings.py walks the unexpected members
                      metadata={"unexpected_members": unexpected} if unexpected else {}, weights_only=weights_only)
    finally:
        archive.close()  # reopened on demand if tensor data is read later


# What torch.save writes beside data.pkl and data/<key>: anything else is walked statically (findings.py).
_SAVED_MEMBERS = ("data.pkl", "version", ".format_version", ".storage_alignment", "byteorder",
                  ".data/version", ".data/serialization_id")


def _unexpected_members(archive: ZipArchive, prefix: str, joined: str) -> list[str]:
    """Members torch.save never writes (``joined`` is every name between newlines); [] at C speed when none."""
    known = sum(1 for n in _SAVED_MEMBERS if f"\n{prefix}{n}\n" in joined) + joined.count(f"\n{prefix}data/")
    if known == len(archive.members) and not archive.duplicates:
        return []
    saved = {prefix + n for n in _SAVED_MEMBERS}
    return [n for n in archive.names() if n not in saved and not n.startswith(prefix + "data/")]


def _archive_warnings(archive: ZipArchive, prefix: str, joined: str) -> list[str]:
    """Odd or duplicate member names. ``joined`` is every name between newlines."""
    warnings = []
    count = len(archive.members)
    plain = (
        "\n/" not in joined and ".." not in joined and "\\" not in joined and "\n\n" not in joined
        and joined.count("\n") == count + 1  # no name holds a newline
        and joined.count("\n" + prefix) == count
    )
    odd = [] if plain else [
        n for n in archive.names() if _ODD_MEMBER.search(n) or not n.startswith(prefix)
    ]
    if odd:
        warnings.append(f"odd archive member names: {', '.join(repr(n) for n in odd[:5])}")
    if archive.duplicates:
        warnings.append(f"duplicate archive members: {', '.join(repr(n) for n in archive.duplicates[:5])}")
    if archive.compressed:
        warnings.append(_compressed_warning(archive))
    return warnings


def _compressed_warning(archive: ZipArchive) -> str:
    """torch.save stores every member; a deflated one was written by another tool (or to inflate at load)."""
    packed = sorted((m for m in archive.entries if m.method), key=lambda m: m.size, reverse=True)
    top = packed[0]
    ratio = top.size / max(top.compressed_size, 1)
    return (f"{len(packed)} archive member(s) compressed, which torch.save never writes: {top.name!r} inflates "
            f"{top.compressed_size:,} bytes to {top.size:,} ({ratio:,.0f}x)")


# --------------------------------------------------------------- TorchScript

# every class of code/: modules (``class X(Module):``) list their parameters and buffers; a scripted class
# (``class X:``, held as an attribute) or an enum has no state_dict entries (nor in torch.jit.load's state_dict())
# (torch prints two-space bodies without blank lines; torch.jit.load compiles any layout Python allows)
_CLASS_RE = re.compile(r"^class[ \t]+(\w+)[ \t]*(\([^)]*\))?[ \t]*:[ \t]*\r?\n((?:(?:[ \t].*)?\r?\n?)*)", re.M)
_LIST_RE = re.compile(r"^[ \t]+(__parameters__|__buffers__)[ \t]*=[ \t]*\[(.*?)\]", re.M | re.S)


def _script_classes(archive: ZipArchive, prefix: str, path: str) -> dict[str, dict[str, list[str]]]:
    """Map ``__torch__.mod.Class`` to its parameter and buffer names, from code/ (never run)."""
    classes: dict[str, dict[str, list[str]]] = {}
    code_prefix = _join(prefix, "code/")
    for name in archive.names():
        if not name.startswith(code_prefix) or not name.endswith(".py"):
            continue
        module = name[len(code_prefix) : -3].replace("/", ".")
        text = archive.read(name, archive.member_limit, "--max-member-bytes").decode("utf-8", "replace")
        for match in _CLASS_RE.finditer(text):
            body = match.group(3)
            lists: dict[str, list[str]] = {"__parameters__": [], "__buffers__": []}
            if (match.group(2) or "").replace(" ", "") != "(Module)":
                lists["not_a_module"] = []
            for lm in _LIST_RE.finditer(body):
                lists[lm.group(1)] = re.findall(r'"([^"]*)"', lm.group(2))
            classes[f"{module}.{match.group(1)}"] = lists
    return classes


MAX_SCRIPT_MODULES = 1_000_000


def torchscript_state_dict(archive: ZipArchive, prefix: str, root: Any, path: str,
                           notes: list[str] | None = None) -> OrderedDict[str, Any]:
    classes = _script_classes(archive, prefix, path)
    out: OrderedDict[str, Any] = OrderedDict()
    packed: set[str] = set()
    visits = [0]

    def walk(obj: Any, at: str, depth: int) -> None:
        if depth > 200 or not isinstance(obj, Placeholder):
            return
        visits[0] += 1
        if visits[0] > MAX_SCRIPT_MODULES:  # modules shared exponentially by a hostile data.pkl
            raise LimitExceeded(f"TorchScript archive lists over {MAX_SCRIPT_MODULES} submodules", path)
        if obj.qualname.startswith("__torch__.torch.classes."):
            packed.add(f"{at.rstrip('.')} ({obj.qualname.removeprefix('__torch__.')})")
            return  # a C++ class (packed params): no code/, no state_dict entry, as torch.jit.load's state_dict()
        attrs = obj.attributes
        info = classes.get(obj.qualname)
        if info is None:
            raise InputError(
                f"TorchScript archive is missing the code for {obj.qualname} (archive member under code/)",
                path,
            )
        if "not_a_module" in info:
            return  # a scripted class or enum: torch.jit.load's state_dict() lists nothing of it
        for name in info["__parameters__"] + info["__buffers__"]:
            value = attrs.get(name)
            if value is not None:
                out[at + name] = value
        for name, value in attrs.items():
            if isinstance(value, Placeholder) and value._ckpt_module.startswith("__torch__"):
                walk(value, f"{at}{name}.", depth + 1)

    if not isinstance(root, Placeholder):
        raise InputError("TorchScript archive's data.pkl does not hold a module", path)
    walk(root, "", 0)
    if packed and notes is not None:
        notes.append("TorchScript C++ objects (packed params) hold tensors that torch.jit.load(...).state_dict() "
                     f"does not list either, so neither does ckpt: {', '.join(sorted(packed)[:5])}")
    return out


READER = FormatReader(Format.TORCH_ZIP, read_torch_zip, unsafe_load=True)
