"""Format detection from bytes: magic numbers and layout, never the file name."""
from __future__ import annotations

import json
import os
import re

from ..errors import InputError, UnsupportedFormat
from ..format_names import Format
from ..io import LEGACY_MAGIC, is_legacy_magic, paths, safetensors_header_length

# pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) as torch's legacy writer emits it
# The same magic number pickled with another protocol (torch.save(..., pickle_protocol=N)):
# LONG1 opcode + bytes for protocols >= 2 (after a FRAME for 4+), text for 0 and 1.
_LEGACY_LONG1 = b"\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
_LEGACY_TEXT = b"L119547037146038801333356"
# Opcodes a protocol 0/1 pickle can start with.
_PICKLE_START = set(b"(}]ciNI\x80KJM)FSVXL")

_TORCH_SAVE = frozenset({Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.TORCHSCRIPT, Format.PICKLE, Format.DILL,
                         Format.TORCH_TAR})
EXPECTED_BY_EXTENSION: dict[str, frozenset[Format]] = {
    ".safetensors": frozenset({Format.SAFETENSORS}),
    ".pth": _TORCH_SAVE,
    ".pt": _TORCH_SAVE,
    ".bin": frozenset({Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.PICKLE}),
    ".ckpt": frozenset({Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.PICKLE}),
    ".tar": frozenset({Format.TORCH_ZIP, Format.TORCH_LEGACY, Format.TORCH_TAR}),
    ".pkl": frozenset({Format.PICKLE, Format.DILL, Format.TORCH_ZIP, Format.TORCH_LEGACY}),
    ".pickle": frozenset({Format.PICKLE, Format.DILL}),
    ".dill": frozenset({Format.PICKLE, Format.DILL}),
    ".json": frozenset({Format.SHARDED}),
    ".jit": frozenset({Format.TORCHSCRIPT}),
    ".pt2": frozenset({Format.TORCH_EXPORT}),
    ".npy": frozenset({Format.NUMPY}),
    ".npz": frozenset({Format.NPZ}),
}
GGUF_MAGIC = b"GGUF"


_USUAL_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def find_index(folder: str) -> str | None:
    """The ``*.index.json`` of a sharded set in ``folder`` (safetensors preferred)."""
    names = paths.listdir(folder)
    indexes = [n for n in names if n.endswith(".index.json")]
    if not names and paths.is_url(folder):  # a server that lists nothing: the names transformers writes
        indexes = [n for n in _USUAL_INDEXES if paths.isfile(paths.join(folder, n))]
    if not indexes:
        return None
    indexes.sort(key=lambda n: (not n.endswith(".safetensors.index.json"), n))
    return paths.join(folder, indexes[0])


def detect(path: str) -> Format:
    """The format of ``path`` judged by its bytes (or, for folders, its members)."""
    if paths.isdir(path):
        if paths.isfile(paths.join(path, ".metadata")):
            return Format.DCP
        from .hf import is_library_folder

        if find_index(path):
            return Format.HF_FOLDER if is_library_folder(path) else Format.SHARDED
        from .deepspeed import is_deepspeed

        if is_deepspeed(path):
            return Format.DEEPSPEED
        from .megatron import is_megatron_legacy
        from .ranks import is_ranks_folder

        if is_megatron_legacy(path):
            return Format.MEGATRON_LEGACY
        if is_ranks_folder(path):
            return Format.RANKS
        if distributed_safetensors_shard(path) is not None:
            return Format.DIST_SAFETENSORS
        if _has_distcp(path):
            raise InputError(
                "torch.distributed.checkpoint folder without its .metadata file (the save did not "
                "finish, or .metadata was not copied); ckpt needs .metadata to read the shards", path,
            )
        if is_library_folder(path):
            return Format.HF_FOLDER
        raise InputError(
            "folder holds no checkpoint (no *.index.json of a sharded set, no DCP .metadata, no DeepSpeed latest "
            "or *_model_states.pt, no per-rank torch.save files of DTensors, no config.json or adapter_config.json "
            "of a library's folder)", path
        )
    with paths.open_bytes(path) as data:
        size = data.size
        head = data.read_upto(0, 64)
        tar_magic = data.read_upto(257, 5) if size >= 512 else b""
    if size == 0:
        raise InputError("empty file (0 bytes)", path)
    if tar_magic == b"ustar":
        return Format.TORCH_TAR
    fmt = detect_bytes(head, size, path)
    if fmt == Format.TORCH_ZIP and _first_member(path, head).endswith(".npy"):
        return Format.NPZ  # np.savez names every member NAME.npy; torch.save's are ARCHIVE/data.pkl, ...
    if fmt == Format.TORCH_ZIP and is_export_archive(path, head):
        return Format.TORCH_EXPORT
    if fmt == Format.PICKLE and paths.basename(path) == ".metadata":
        return Format.DCP  # the metadata file of a torch.distributed.checkpoint folder, given directly
    return fmt


def _first_member(path: str, head: bytes) -> str:
    """The name in a zip's first local header (``head``: the file's first bytes)."""
    n = int.from_bytes(head[26:28], "little") if len(head) >= 30 else 0
    raw = head[30:30 + n]
    if len(raw) < n:  # a long first name: read it (one small read, local or remote)
        with paths.open_bytes(path) as data:
            raw = data.read_upto(30, n)
    return raw.decode("utf-8", "replace")


def is_export_archive(path: str, head: bytes) -> bool:
    """A zip that torch.export.save wrote: an ``archive_format`` record in the archive's folder.

    The first local header (in ``head``, the file's first bytes) usually
    tells: torch.export.save writes its weights, constants or models first,
    torch.save its data.pkl. Only a zip whose first member says neither has
    its central directory read here.
    """
    from ..io.zip import ZipArchive
    from ..pickles import FIRST_MEMBER_DIRS, archive_root

    name = _first_member(path, head)
    inner = name.split("/", 1)[1] if "/" in name else ""
    if inner.startswith(FIRST_MEMBER_DIRS) or inner == "archive_format":
        return True
    if inner in ("data.pkl", "") or inner.startswith(("code/", "constants.pkl", ".data/")):
        return False
    try:
        archive = ZipArchive(path)
    except InputError:
        return False  # the torch-zip reader says what is wrong with it
    try:
        return archive_root(archive.names()) is not None
    finally:
        archive.close()


_DISTRIBUTED_NAME = re.compile(r"shard-\d{5}-model-\d{5}-of-\d{5}\.safetensors$")


def is_distributed_shard(name: str, sharding_info: object) -> bool:
    """Whether a safetensors file with DCP_SHARDING_INFO holds one rank's slices, not whole tensors.

    DCP's HuggingFaceStorageWriter writes DCP_SHARDING_INFO into every file:
    with ``save_distributed=True`` each rank writes ``shard-RRRRR-model-...``
    holding its slices (no index); rank-0 saves (``model-0000N-of-...`` and
    an index) hold whole tensors, every ``saved_offsets`` zero. A slice at a
    nonzero offset is one rank's, whatever the file is called.
    """
    if _DISTRIBUTED_NAME.search(name):
        return True
    try:
        info = json.loads(sharding_info) if isinstance(sharding_info, str) else None
    except ValueError:
        return True  # unreadable placement: never read as whole tensors
    if not isinstance(info, dict):
        return True
    for entry in info.values():
        offsets = entry.get("saved_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or any(o != 0 for o in offsets):
            return True
    return False


def distributed_safetensors_shard(folder: str) -> str | None:
    """A ``*.safetensors`` file of ``folder`` that holds one rank's slices (None: none does)."""
    try:
        names = sorted(n for n in paths.listdir(folder) if n.endswith(".safetensors"))
    except InputError:
        return None
    for name in names[:8]:  # the writer names them shard-NNNNN-model-...: the first few tell
        try:
            with paths.open_bytes(paths.join(folder, name)) as data:
                head = data.read_upto(0, 8)
                n = int.from_bytes(head, "little") if len(head) == 8 else 0
                raw = data.read_upto(8, min(n, 1 << 20))
            if b'"DCP_SHARDING_INFO"' not in raw:
                continue
            meta = json.loads(raw.decode("utf-8", "replace")).get("__metadata__") or {}
        except (InputError, ValueError, AttributeError):
            continue
        if isinstance(meta, dict) and is_distributed_shard(name, meta.get("DCP_SHARDING_INFO")):
            return name
    return None


def _has_distcp(folder: str) -> bool:
    try:
        return any(name.endswith(".distcp") for name in paths.listdir(folder))
    except InputError:
        return False


def detect_bytes(head: bytes, size: int, path: str) -> Format:
    if head.startswith(b"PK\x03\x04"):
        return Format.TORCH_ZIP  # the torch-zip reader tells TorchScript apart from its members
    if head.startswith(b"\x93NUMPY"):
        return Format.NUMPY
    if head.startswith(GGUF_MAGIC):
        raise UnsupportedFormat(gguf_message(head), path)
    if head.startswith(LEGACY_MAGIC) or head.startswith(_LEGACY_TEXT) or is_legacy_magic(head):
        return Format.TORCH_LEGACY  # torch compares the magic number's value, whatever opcodes spell it
    if head[:1] == b"\x80" and _LEGACY_LONG1 in head[:24]:
        return Format.TORCH_LEGACY
    n = safetensors_header_length(head)
    if n is not None:
        if n <= size - 8:
            return Format.SAFETENSORS
        if path.endswith(".safetensors"):
            raise InputError(f"truncated safetensors file: its header claims {n} bytes but only {size - 8} follow "
                             "(an interrupted download?)", path)
    if head[:1] == b"{" and path.endswith(".json"):
        return Format.SHARDED
    if head[:1] == b"\x80" and len(head) > 1 and 0 <= head[1] <= 5:
        return Format.PICKLE
    if head[:1] and head[0] in _PICKLE_START and not head[:1].isspace():
        return Format.PICKLE
    if head.startswith(b"PK\x05\x06"):
        raise InputError("an empty zip archive: it holds no arrays or tensors (np.savez with no arrays writes one)",
                         path)
    if head.startswith(b"PK"):
        raise InputError("corrupt zip archive: not a local file header at the start", path)
    raise UnsupportedFormat(
        "not a checkpoint ckpt can read (unrecognised bytes: not a torch zip, legacy torch, "
        "pickle, safetensors, sharded index or DCP folder)",
        path,
    )


def gguf_message(head: bytes) -> str:
    """The refusal of a GGUF file, naming what it is (a later release reads its tensors)."""
    version = int.from_bytes(head[4:8], "little") if len(head) >= 8 else 0
    return (f"a GGUF file (llama.cpp / ggml's format, version {version}): ckpt does not read GGUF yet; "
            "convert it with gguf-py or llama.cpp's scripts to safetensors to inspect or migrate it")


def extension_warning(path: str, fmt: str) -> str | None:
    """A warning when the file name suggests another format than the bytes."""
    name = paths.basename(path.rstrip("/"))
    if paths.isdir(path):
        return None
    ext = os.path.splitext(name)[1].lower()
    expected = EXPECTED_BY_EXTENSION.get(ext)
    if expected is not None and fmt not in expected:
        return f"the extension {ext} suggests {'/'.join(sorted(expected))} but the bytes are {fmt}"
    return None
