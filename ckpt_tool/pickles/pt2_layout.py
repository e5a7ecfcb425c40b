"""The layout of a torch.export ``.pt2`` archive, and which of its members a loader unpickles.

torch 2.13's ``torch.export.save`` (torch/export/pt2_archive/_package.py)
writes, under one folder: ``archive_format`` ("pt2"), ``models/NAME.json``
(the serialized graph), ``data/weights/NAME_weights_config.json`` and
``data/constants/NAME_constants_config.json`` (one PayloadMeta per tensor:
its member, dtype, sizes, strides, storage offset), the tensors as raw bytes
(``use_pickle: false``) or torch.save blobs (``use_pickle: true``, read
with ``torch.load(weights_only=False)``), ``custom_obj_N`` (TorchScript's
pickler) and ``opaque_obj_N`` (``pickle.loads``) constants, and
``data/sample_inputs/NAME.pt`` (``torch.load``, retried with
``weights_only=False``). The scanner and the reader share this one reading
of the configs; nothing here imports torch.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

ARCHIVE_FORMAT = "archive_format"
ARCHIVE_FORMAT_VALUE = b"pt2"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
SAMPLE_INPUTS_DIR = "data/sample_inputs/"
MODELS_DIR = "models/"
EXTRA_DIR = "extra/"
WEIGHTS_CONFIG = "_weights_config.json"
CONSTANTS_CONFIG = "_constants_config.json"
TENSOR_PREFIX = "tensor_"
CUSTOM_OBJ_PREFIX = "custom_obj_"
OPAQUE_OBJ_PREFIX = "opaque_obj_"
# Folders of compiled code (AOTInductor shared libraries, ExecuTorch and MTIA programs): native code a loader runs.
NATIVE_DIRS = ("data/aotinductor/", "data/executorch/", "data/mtia/")
# Text records beside the payloads: never unpickled.
TEXT_RECORDS = frozenset([ARCHIVE_FORMAT, "archive_version", ".data/version", "byteorder",
                          ".data/serialization_id", ".data/.format_version", ".data/.storage_alignment"])
# Where the first member of a torch.export.save archive lies (detect.py tells a .pt2 from its first name).
FIRST_MEMBER_DIRS = (WEIGHTS_DIR, CONSTANTS_DIR, MODELS_DIR, SAMPLE_INPUTS_DIR, *NATIVE_DIRS)


class MemberKind(str, Enum):
    """How a loader treats one member of a .pt2 archive."""

    TEXT = "text"  # a record or JSON config: parsed, never unpickled
    RAW = "raw"  # tensor bytes read as a storage (use_pickle: false)
    PICKLE = "pickle"  # unpickled (torch.load, pickle.loads, TorchScript's unpickler)
    NATIVE = "native"  # compiled code a loader runs (AOTInductor .so, ExecuTorch, MTIA)
    UNKNOWN = "unknown"  # nothing in torch.export's layout: fail closed


@dataclass(frozen=True, kw_only=True)
class Payload:
    """One entry of a weights or constants config: a tensor (or object) and the member that holds it."""

    fqn: str
    member: str  # path_name inside its folder (weight_0, tensor_1, custom_obj_0)
    is_param: bool
    use_pickle: bool
    dtype: int | None = None  # torch._export.serde.schema.ScalarType
    sizes: tuple[int, ...] | None = None
    strides: tuple[int, ...] | None = None
    storage_offset: int = 0
    layout: int | None = None
    symbolic: bool = False  # a size, stride or offset that is a symbol, not a number


class ConfigError(ValueError):
    """A weights or constants config that is not what torch.export.save writes."""


def archive_root(names: Sequence[str]) -> str | None:
    """The archive's folder with its slash when it is a .pt2 (its ``archive_format`` record is there)."""
    if not names or "/" not in names[0]:
        return None
    root = names[0].split("/", 1)[0] + "/"
    return root if root + ARCHIVE_FORMAT in names else None


def model_names(names: Sequence[str], root: str) -> list[str]:
    """The exported programs in the archive (``models/NAME.json``), in archive order."""
    prefix = root + MODELS_DIR
    return [n[len(prefix):-5] for n in names if n.startswith(prefix) and n.endswith(".json")
            and "/" not in n[len(prefix):]]


def _ints(value: object, what: str) -> tuple[tuple[int, ...], bool]:
    """A serialized SymInt list (``[{"as_int": 3}, ...]``): the numbers, and whether a symbol was among them."""
    if not isinstance(value, list):
        raise ConfigError(f"{what} is not a list")
    out: list[int] = []
    symbolic = False
    for item in value:
        n = item.get("as_int") if isinstance(item, dict) else None
        if type(n) is int:
            out.append(n)
        else:
            symbolic = True
            out.append(-1)
    return tuple(out), symbolic


def _payload(fqn: str, meta: Mapping[str, object]) -> Payload:
    member = meta.get("path_name")
    use_pickle = meta.get("use_pickle")
    if not isinstance(member, str) or not member or "/" in member or not isinstance(use_pickle, bool):
        raise ConfigError(f"entry {fqn!r} has no plain path_name and use_pickle")
    tm = meta.get("tensor_meta")
    if tm is None:
        return Payload(fqn=fqn, member=member, is_param=bool(meta.get("is_param")), use_pickle=use_pickle)
    if not isinstance(tm, dict) or type(tm.get("dtype")) is not int:
        raise ConfigError(f"entry {fqn!r} has no tensor_meta with a dtype")
    sizes, sym_sizes = _ints(tm.get("sizes"), f"{fqn!r} sizes")
    strides, sym_strides = _ints(tm.get("strides"), f"{fqn!r} strides")
    offset = tm.get("storage_offset")
    as_int = offset.get("as_int") if isinstance(offset, dict) else None
    layout = tm.get("layout")
    return Payload(fqn=fqn, member=member, is_param=bool(meta.get("is_param")), use_pickle=use_pickle,
                   dtype=tm["dtype"], sizes=sizes, strides=strides,
                   storage_offset=as_int if type(as_int) is int else 0,
                   layout=layout if type(layout) is int else None,
                   symbolic=sym_sizes or sym_strides or type(as_int) is not int)


def parse_config(raw: bytes) -> list[Payload]:
    """The entries of one ``*_config.json`` (``{"config": {fqn: PayloadMeta}}``), in file order."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not JSON: {exc}") from None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError('no "config" object')
    out = []
    for fqn, meta in config.items():
        if not isinstance(meta, dict):
            raise ConfigError(f"entry {fqn!r} is not an object")
        out.append(_payload(fqn, meta))
    return out


def config_members(root: str, model: str) -> tuple[str, str]:
    """The weights and constants config members of one exported program."""
    return root + WEIGHTS_DIR + model + WEIGHTS_CONFIG, root + CONSTANTS_DIR + model + CONSTANTS_CONFIG


def classify(names: Sequence[str], root: str, configs: Mapping[str, Sequence[Payload]]) -> dict[str, MemberKind]:
    """Every member's kind, from its name and the configs (member -> entries) that name it.

    A payload is raw only when every config entry naming it says so; any
    entry with ``use_pickle`` makes it a pickle. Legacy ``data/weights/NAME.pt``
    and ``data/constants/NAME.pt`` files (the state_dict torch.save'd whole)
    are torch.load'ed; a member under no folder torch.export writes is UNKNOWN.
    """
    pickled: set[str] = set()
    raw: set[str] = set()
    for folder, entries in configs.items():
        for p in entries:
            name = root + folder + p.member
            if p.use_pickle or p.member.startswith((CUSTOM_OBJ_PREFIX, OPAQUE_OBJ_PREFIX)):
                pickled.add(name)
            else:
                raw.add(name)
    out: dict[str, MemberKind] = {}
    for name in names:
        inner = name[len(root):] if name.startswith(root) else None
        if inner is None or inner == "":
            out[name] = MemberKind.UNKNOWN
        elif name.endswith("/"):
            out[name] = MemberKind.TEXT  # a folder entry: no bytes
        elif name in pickled:  # before the names: a config may point a pickle at any member
            out[name] = MemberKind.PICKLE
        elif inner in TEXT_RECORDS or (inner.startswith((WEIGHTS_DIR, CONSTANTS_DIR)) and inner.endswith(
                (WEIGHTS_CONFIG, CONSTANTS_CONFIG))) or (inner.startswith(MODELS_DIR) and inner.endswith(".json")):
            out[name] = MemberKind.TEXT
        elif inner.startswith(SAMPLE_INPUTS_DIR) or (
                inner.startswith((WEIGHTS_DIR, CONSTANTS_DIR)) and inner.endswith(".pt")):
            out[name] = MemberKind.PICKLE
        elif name in raw:
            out[name] = MemberKind.RAW
        elif inner.startswith(NATIVE_DIRS):
            out[name] = MemberKind.NATIVE
        elif inner.startswith(EXTRA_DIR):
            out[name] = MemberKind.TEXT  # extra_files: handed back as strings, never unpickled
        else:
            out[name] = MemberKind.UNKNOWN
    return out
