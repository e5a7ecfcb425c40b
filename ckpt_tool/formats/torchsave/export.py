"""A torch.export ``.pt2`` archive read from its own files: configs for the metadata, members for the bytes.

``torch.export.save`` stores each weight, buffer and constant tensor either
as the raw bytes of its storage (``use_pickle: false``: the config gives
dtype, sizes, strides and storage offset) or, for tensor subclasses, as a
torch.save blob. Raw tensors become TensorMetas over the archive's members
(tensors sharing a member share a storage, as torch.export.load's aliasing
does); blobs go through the restricted torch.save reader. Nothing is
deserialized by torch and the graph (``models/NAME.json``) is not read.

The ExportedProgram's ``state_dict`` (parameters and persistent buffers) is
the state_dict every command uses, so that migrate writes what
``module.load_state_dict`` takes; its constants (lifted tensor constants and
non-persistent buffers, never in a module's state_dict) are described in the
metadata, under ``torch_export.constants``: dtype and shape of each.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from ...errors import InputError
from ...format_names import Format
from ...io.zip import ZipArchive, zip_source
from ...model import DataSource, GlobalRef, StorageRef, TensorMeta
from ...pickles import (
    ARCHIVE_FORMAT,
    ARCHIVE_FORMAT_VALUE,
    CONSTANTS_DIR,
    CUSTOM_OBJ_PREFIX,
    OPAQUE_OBJ_PREFIX,
    WEIGHTS_DIR,
    ConfigError,
    Payload,
    config_members,
    model_names,
    parse_config,
)
from ...pickles.torch_rules import inputs as wo_input
from ..interface import FormatReader, Loaded, ReadOptions
from .archive import archive_prefix, check_version

# torch._export.serde.schema.ScalarType -> ckpt's dtype names
SCALAR_TYPES: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32", 8: "float64",
    9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16", 28: "uint16",
    29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz", 32: "float8_e5m2fnuz", 33: "float8_e8m0fnu",
    34: "uint32", 35: "uint64",
}
STRIDED = 7  # schema.Layout.Strided: the only layout stored as plain bytes
NOTE = ("a torch.export archive: torch.export.load reads it (torch.load refuses it: no data.pkl), unpickling its "
        "use_pickle members and sample inputs with weights_only=False")

BlobRead = Callable[..., tuple[object, list[GlobalRef]]]


class _Reading:
    """What one read gathers: the two dicts, the globals blobs name, notes, one StorageRef per member."""

    def __init__(self, archive: ZipArchive, root: str, source: DataSource, options: ReadOptions) -> None:
        self.archive, self.root, self.source, self.options = archive, root, source, options
        self.references: list[GlobalRef] = []
        self.objects: list[str] = []
        self.storages: dict[str, StorageRef] = {}

    @property
    def path(self) -> str:
        return self.archive.path

    def member(self, folder: str, name: str) -> str:
        member = self.archive.resolve(self.root + folder + name)
        if member is None:
            raise InputError(f"archive member {self.root + folder + name!r} named by the config is missing",
                             self.path)
        return member

    def config(self, member: str) -> list[Payload]:
        raw = self.archive.read(member, self.options.limits.max_pickle_bytes, "--max-pickle-bytes")
        try:
            return parse_config(raw)
        except ConfigError as exc:
            raise InputError(f"{member}: {exc} (torch.export.load cannot read it either)", self.path) from None

    def blob(self, member: str) -> object:
        """A torch.save blob, read by the restricted reader (torch.export.load torch.loads it)."""
        read_blob: BlobRead | None = self.options.read_blob
        if read_blob is None:
            from ..torchsave.inmemory import read_torch_blob

            read_blob = read_torch_blob
        data = self.archive.read(member, self.options.limits.max_pickle_bytes, "--max-pickle-bytes")
        obj, refs = read_blob(data, path=self.path, where=member, limits=self.options.limits)
        self.references.extend(refs)
        return obj

    def tensor(self, folder: str, p: Payload) -> object:
        member = self.member(folder, p.member)
        if p.use_pickle:
            return self.blob(member)
        dtype = SCALAR_TYPES.get(p.dtype if p.dtype is not None else -1)
        if dtype is None or p.sizes is None:
            raise InputError(f"{p.fqn!r}: scalar type {p.dtype} is not one ckpt knows", self.path)
        if p.layout not in (None, STRIDED):
            raise InputError(f"{p.fqn!r}: layout {p.layout} is not strided (torch.export stores no other layout "
                             "as raw bytes)", self.path)
        if p.symbolic:
            raise InputError(f"{p.fqn!r}: a symbolic size or stride in a stored tensor", self.path)
        strides = p.strides if p.strides is not None else ()
        if len(strides) != len(p.sizes) or min((*p.sizes, *strides, p.storage_offset), default=0) < 0:
            raise InputError(f"{p.fqn!r}: sizes {list(p.sizes)}, strides {list(strides)} and offset "
                             f"{p.storage_offset} are not a tensor torch could store", self.path)
        ref = self.storages.get(member)
        if ref is None:
            ref = StorageRef(self.source, member, self.archive.members[member].size)
            self.storages[member] = ref
        meta = TensorMeta(p.fqn, dtype, p.sizes, p.strides, p.storage_offset, ref)
        if meta.byte_span[1] > ref.nbytes:  # the config's word against the member's bytes: never a tensor unread
            raise InputError(f"tensor {p.fqn!r} reaches past the end of its member {member!r} ({ref.nbytes} bytes)",
                             self.path)
        return meta

    def payloads(self, folder: str, entries: list[Payload], prefix: str, out: OrderedDict[str, object]) -> None:
        for p in entries:
            key = prefix + p.fqn
            if key in out:
                raise InputError(f"{key!r} is listed twice in the archive's configs", self.path)
            if p.member.startswith((CUSTOM_OBJ_PREFIX, OPAQUE_OBJ_PREFIX)):
                self.objects.append(key)  # a ScriptObject or an opaque Python object: pickled, not a tensor
                continue
            out[key] = self.tensor(folder, p)

    def legacy(self, member: str, prefix: str, out: OrderedDict[str, object]) -> None:
        """The legacy layout: the whole state_dict (or constants) torch.save'd in one member."""
        obj = self.blob(member)
        if not isinstance(obj, dict):
            raise InputError(f"{member} holds no dict of tensors", self.path)
        out.update((prefix + str(k), v) for k, v in obj.items())


def _described(value: object) -> dict[str, object]:
    """A constant as inspect's metadata shows it: dtype and shape (a pickled tensor: what its reader found)."""
    if isinstance(value, TensorMeta):
        return {"dtype": value.dtype, "shape": list(value.shape)}
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if isinstance(dtype, str) and isinstance(shape, tuple):
        return {"dtype": dtype, "shape": list(shape)}
    return {"type": type(value).__name__}


def read_export(path: str, options: ReadOptions) -> Loaded:
    archive = ZipArchive(path, options.limits.max_member_bytes)
    try:
        root = archive_prefix(archive)
        check_version(archive, root)
        fmt = archive.resolve(root + ARCHIVE_FORMAT)
        if fmt is None or archive.read(fmt, 64).strip() != ARCHIVE_FORMAT_VALUE:
            raise InputError(f"not a torch.export archive: {root + ARCHIVE_FORMAT!r} is missing or not 'pt2'", path)
        models = model_names(archive.names(), root)
        if not models:
            raise InputError(f"a .pt2 archive with no exported program (no {root}models/*.json): nothing to read "
                             "(an AOTInductor-only package holds compiled code, not a state_dict)", path)
        source = zip_source(archive)
        reading = _Reading(archive, root, source, options)
        state: OrderedDict[str, object] = OrderedDict()
        constants: OrderedDict[str, object] = OrderedDict()
        counts: dict[str, int] = {"parameters": 0, "buffers": 0}
        for model in models:
            prefix = "" if len(models) == 1 else f"{model}."
            for folder, config, out in zip((WEIGHTS_DIR, CONSTANTS_DIR), config_members(root, model),
                                           (state, constants), strict=True):
                legacy = archive.resolve(f"{root}{folder}{model}.pt")
                if legacy is not None:
                    reading.legacy(legacy, prefix, out)
                    continue
                member = archive.resolve(config)
                if member is None:
                    raise InputError(f"archive member {config!r} is missing (torch.export.load needs it)", path)
                entries = reading.config(member)
                reading.payloads(folder, entries, prefix, out)
                if folder == WEIGHTS_DIR:
                    counts["parameters"] += sum(p.is_param for p in entries)
                    counts["buffers"] += sum(not p.is_param for p in entries)
        flat = all(isinstance(v, TensorMeta) and v.key == k for k, v in state.items())
        info = {"programs": models, **counts, "constants": {k: _described(v) for k, v in constants.items()},
                **({"object_constants": reading.objects} if reading.objects else {})}
        warnings = (f"constants that are objects, not tensors (torch.export.load unpickles them): "
                    f"{', '.join(reading.objects[:5])}{' ...' if len(reading.objects) > 5 else ''}",
                    ) if reading.objects else ()
        return Loaded(Format.TORCH_EXPORT, state, tuple(reading.references), warnings, (source,), layout="state_dict",
                      metadata={"torch_export": info}, weights_only=wo_input.WeightsOnlyInput(
                          wo_input.OTHER, path=path, note=NOTE),
                      tensors=tuple(v for v in state.values() if isinstance(v, TensorMeta)) if flat else None)
    finally:
        archive.close()  # reopened on demand if tensor data is read later


READER = FormatReader(Format.TORCH_EXPORT, read_export)
