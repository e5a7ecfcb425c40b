"""ckpt's inert list: the globals a pickle may call or construct without being dangerous.

It is torch's own weights_only allowlist (``weights_only.TABLE``, the newest
rules: what ``torch.load(weights_only=True)`` calls and constructs itself)
plus the short list below, each entry reviewed against its source (CPython
3.11, torch 2.13, NumPy 2.4, DeepSpeed 0.19) and given its reason. An entry
is inert when importing its module runs no code but the library's own,
and calling or constructing it, then BUILD (its ``__setstate__`` or a
``__dict__`` update), only builds a value: it opens no file, starts no
process, imports nothing by name, registers no hook and unpickles no
nested bytes. Each entry has a test with a real file (tests/pickles/test_verdicts.py).

Some inert callables call or construct an *argument* (``copyreg._reconstructor(cls,
...)``, ``collections.defaultdict(factory)``, ``torch._tensor._rebuild_from_type_v2(func,
type, ...)``): ``TRAMPOLINES`` says how, and the walk judges that argument as
called (pickles/walk/walker.py), so an inert function never launders a dangerous one.
"""
from __future__ import annotations

from .torch_rules import NEWEST, TABLE

Pair = tuple[str, str]


def _split(qualname: str) -> Pair:
    module, _, name = qualname.rpartition(".")
    return module, name


# What torch.load(weights_only=True) allows by default, as (module, name).
WEIGHTS_ONLY: frozenset[Pair] = frozenset(_split(n) for n in TABLE[NEWEST].allowed)

_PY_VALUES = "Python's own value types: constructing one runs no code from the pickle"
_RETURN_TYPES = (
    "aminmax", "cummax", "cummin", "frexp", "geqrf", "histogram", "kthvalue", "linalg_cholesky_ex", "linalg_eig",
    "linalg_eigh", "linalg_inv_ex", "linalg_ldl_factor", "linalg_ldl_factor_ex", "linalg_lstsq", "linalg_lu",
    "linalg_lu_factor", "linalg_lu_factor_ex", "linalg_qr", "linalg_slogdet", "linalg_solve_ex", "linalg_svd",
    "lu_unpack", "max", "median", "min", "mode", "nanmedian", "qr", "slogdet", "sort", "svd", "topk",
    "triangular_solve"
)

_DTENSOR = "a DTensor: Tensor._make_wrapper_subclass of its global size, then its _local_tensor and _spec slots"
_DTENSOR_SPEC = "a DTensor's spec: a dataclass or NamedTuple of its mesh, placements, shape and stride"

REVIEWED: dict[Pair, str] = {
    **{("builtins", n): _PY_VALUES for n in
       ("list", "dict", "tuple", "frozenset", "bytes", "int", "float", "str", "bool", "slice", "range", "object")},
    ("builtins", "Ellipsis"): "the constant ``...``: a reference, nothing to call",
    ("collections", "deque"): "a container; deque(items, maxlen) only stores them",
    ("collections", "defaultdict"): "a dict; its factory argument is judged as called (a trampoline)",
    ("copyreg", "_reconstructor"): "protocol 0/1 objects; constructs its cls and base arguments, judged as called",
    ("copyreg", "__newobj__"): "protocol 0/1 objects; cls.__new__(cls, *args): cls is judged as constructed",
    ("copyreg", "__newobj_ex__"): "as __newobj__, with keyword arguments",
    ("datetime", "datetime"): "a value; C type, __reduce__ passes bytes and an optional tzinfo",
    ("datetime", "date"): "a value (bytes)",
    ("datetime", "time"): "a value (bytes, optional tzinfo)",
    ("datetime", "timedelta"): "a value (days, seconds, microseconds)",
    ("datetime", "timezone"): "a fixed UTC offset (timezone-aware datetimes); reads no tz database",
    ("decimal", "Decimal"): "a number built from its string",
    ("fractions", "Fraction"): "a number built from its string",
    ("uuid", "UUID"): "a value; __setstate__ sets its int",
    **{("pathlib", n): "a path value: constructing it never touches the file system"
       for n in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")},
    ("argparse", "Namespace"): "training scripts' args: a plain class, NEWOBJ + __dict__ update",
    ("types", "SimpleNamespace"): "a plain attribute holder (C type), NEWOBJ/REDUCE + __dict__ update",
    ("re", "_compile"): "what a compiled regular expression pickles as: compiles the pattern, CPU only",
    # NumPy arrays, scalars, dtypes (numpy.core: the NumPy 1.x spelling of numpy._core)
    **{(m, n): "NumPy arrays: ndarray.__new__(subtype) + __setstate__ with the raw bytes; subtype is judged"
       for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct",)},
    **{(m, "scalar"): "a NumPy scalar from its dtype and bytes"
       for m in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(m, "_frombuffer"): "protocol-5 NumPy arrays: an array over a bytes buffer"
       for m in ("numpy.core.numeric", "numpy._core.numeric")},
    ("numpy", "ndarray"): "the array type, passed to _reconstruct",
    ("numpy", "dtype"): "a NumPy dtype from its type string; __setstate__ sets byte order and fields",
    # NumPy random state (Generator, RandomState, SeedSequence, bit generators)
    ("numpy.random._pickle", "__generator_ctor"): "Generator(bit_generator_ctor(name)): calls its ctor argument",
    ("numpy.random._pickle", "__randomstate_ctor"): "RandomState(bit_generator_ctor(name)): calls its ctor argument",
    ("numpy.random._pickle", "__bit_generator_ctor"): "bit_generator() when given a type: calls its argument",
    **{(f"numpy.random.{m}", n): "a NumPy bit generator; __setstate__ sets its state dict"
       for m, n in (("_mt19937", "MT19937"), ("_pcg64", "PCG64"), ("_pcg64", "PCG64DXSM"),
                    ("_philox", "Philox"), ("_sfc64", "SFC64"))},
    ("numpy.random.bit_generator", "SeedSequence"): "NumPy's seed sequence: entropy and pool as arrays",
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"):
        "Cython's unpickler: checks a checksum, SeedSequence.__new__(type) (type judged), sets fields",
    # torch beyond weights_only's defaults
    ("torch._tensor", "_rebuild_from_type"): "the older _rebuild_from_type_v2: func(*args).as_subclass(type)",
    ("torch.storage", "_load_from_bytes"): "torch.load of nested torch.save bytes: ckpt walks those bytes too",
    **{("torch.return_types", n): "torch.return_types (torch.max(x, 0), ...): a structseq of tensors"
       for base in _RETURN_TYPES for n in (base, f"{base}_out")},
    ("torch.return_types", "histogramdd"): "torch.return_types (torch.histogramdd): a structseq of tensors",
    ("torch.nested._internal.nested_tensor", "NestedTensor"):
        "jagged nested tensors: torch.nested add_safe_globals it; __new__ from values and offsets",
    ("torch.nested._internal.nested_tensor", "_rebuild_njt"): "NestedTensor(**kwargs) (see NestedTensor)",
    ("torch._dynamo.decorators", "_DimRange"): "a dataclass (dim, min, max) in a jagged tensor's metadata",
    **{("torch.jit._pickle", n): "TorchScript's data builders: return their argument (torch/jit/_pickle.py)"
       for n in ("build_intlist", "build_tensorlist", "build_doublelist", "build_boollist",
                 "build_tensor_from_id", "restore_type_tag")},
    **{("torch.distributed.checkpoint.metadata", n): "DCP .metadata: a dataclass or Enum of torch's"
       for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): "DCP .metadata: where an item lies (dataclass)",
    # Megatron-core's planner keeps every rank's save plan in .metadata (all_local_plans): torch's frozen
    # dataclasses and an Enum (torch/distributed/checkpoint/planner.py), no __setstate__ or __reduce__ of their own
    **{("torch.distributed.checkpoint.planner", n): "DCP .metadata: a rank's save plan (Megatron's all_local_plans)"
       for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData")},
    # DTensors saved per rank (verl, an FSDP2 model's state_dict()): torch 2.13's own value classes. The
    # tensor is Tensor._make_wrapper_subclass (via _rebuild_wrapper_subclass) plus two slots; the rest are
    # dataclasses, NamedTuples and placements built by NEWOBJ + BUILD. DeviceMesh.__setstate__ updates its
    # __dict__ and looks process groups up by name in the local registry (a miss logs a warning): no
    # process, file or network. formats/ranks/ reads them statically (docs/consolidate.md).
    ("torch.distributed.tensor", "DTensor"): _DTENSOR,
    **{("torch.distributed.tensor._dtensor_spec", n): _DTENSOR_SPEC
       for n in ("DTensorSpec", "TensorMeta", "ShardOrderEntry")},
    **{("torch.distributed.tensor.placement_types", n): "a DTensor placement: NEWOBJ + BUILD of its dim (a value)"
       for n in ("Shard", "Replicate", "Partial", "_StridedShard")},
    ("torch.distributed.device_mesh", "DeviceMesh"): "a DTensor's mesh: __setstate__ updates __dict__, looks process "
        "groups up by name (no process, file, network)",
    **{("torch.distributed._mesh_layout", n): "a DeviceMesh's layout: a dataclass of shapes and strides"
       for n in ("_MeshLayout", "_FlatLayout")},
    # FSDP1 SHARDED_STATE_DICT (ShardedTensor): its records are inert; ShardedTensor itself is NOT listed: its
    # __setstate__ demands a process group and, with init_rrefs True, joins the RPC agent (_post_init ->
    # _init_rpc). The walk vouches for it only as torch.save writes it (walk/walker.py _sharded_tensor_rebuild:
    # the wrapper-subclass rebuild, init_rrefs False); ShardedTensor.ProcessGroupState (catalog) is reached by
    # getattr of that constant name, judged as the dotted name.
    **{(m, n): "a ShardedTensor's shard and placement records: dataclasses, an Enum, a device string"
       for m, n in (("torch.distributed._shard.sharded_tensor.shard", "Shard"),
                    ("torch.distributed._shard.metadata", "ShardMetadata"),
                    ("torch.distributed._shard.sharded_tensor.metadata", "ShardedTensorMetadata"),
                    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
                    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
                    ("torch.distributed.remote_device", "_remote_device"),
                    ("torch.distributed._shard.sharding_spec.chunk_sharding_spec", "ChunkShardingSpec"),
                    ("torch.distributed._shard.sharding_spec.api", "EnumerableShardingSpec"))},
    # DeepSpeed optimizer states (deepspeed/runtime/fp16/loss_scaler.py, zero/config.py, utils/tensor_fragment.py)
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"): "a plain class, no __new__ or __setstate__",
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"): "an int Enum, looked up by value",
    ("deepspeed.utils.tensor_fragment", "fragment_address"): "a dataclass (numel, start)",
}

# torch attributes that are constants (dtypes, layouts, memory formats, qschemes): referenced, never called.
TORCH_CONSTANTS = frozenset([
    "cfloat", "cdouble", "half", "float", "double", "long", "int", "short", "bool", "strided", "sparse_coo",
    "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "jagged", "_mkldnn", "contiguous_format",
    "channels_last", "channels_last_3d", "preserve_format", "float4_e2m1fn_x2",
])

# Inert callables that call or construct an argument, and what they do with it (for the messages).
TRAMPOLINES: dict[Pair, str] = {
    **{(m, f): "constructs it"
       for m in ("copyreg", "copy_reg") for f in ("_reconstructor", "__newobj__", "__newobj_ex__")},
    ("torch.serialization", "persistent_load"): "rebuilds a storage with it (a persistent id names it)",
    ("collections", "defaultdict"): "calls it as the default factory",
    ("torch._tensor", "_rebuild_from_type_v2"): "calls or constructs it",
    ("torch._tensor", "_rebuild_from_type"): "calls or constructs it",
    ("torch._utils", "_rebuild_wrapper_subclass"): "constructs it",
    ("torch._utils", "_rebuild_parameter_with_state"): "keeps it as a backward hook (called by backward)",
    ("torch._utils", "_rebuild_parameter"): "keeps it as a backward hook (called by backward)",
    ("torch._utils", "_rebuild_tensor_v2"): "keeps it as a backward hook (called by backward)",
    ("numpy.core.multiarray", "_reconstruct"): "constructs it",
    ("numpy._core.multiarray", "_reconstruct"): "constructs it",
    ("numpy.random._pickle", "__generator_ctor"): "calls it",
    ("numpy.random._pickle", "__randomstate_ctor"): "calls it",
    ("numpy.random._pickle", "__bit_generator_ctor"): "calls it",
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"): "constructs it",
}
# Callees whose tuple arguments are sizes and strides, never applied: only their direct arguments are judged.
SHALLOW: frozenset[Pair] = frozenset(
    ("torch._utils", f) for f in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_qtensor",
                                  "_rebuild_parameter", "_rebuild_meta_tensor_no_storage", "_rebuild_sparse_tensor",
                                  "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor"))


def is_inert(module: str, name: str) -> bool:
    """On the inert list: torch's weights_only defaults, the reviewed entries, torch's own classes and constants."""
    key = (module, name)
    if key in WEIGHTS_ONLY or key in REVIEWED:
        return True
    from .catalog import inert_entry  # the reviewed catalog: loaded only for a global outside the fast tables

    if inert_entry(module, name) is not None:
        return True
    return module == "torch" and (name.endswith(("Storage", "Tensor")) or name in TORCH_CONSTANTS or _dtype(name))


def _dtype(name: str) -> bool:
    from .. import dtypes

    return name in dtypes.BY_NAME


def reason(module: str, name: str) -> str:
    """Why an inert global is on the list (for docs and --verbose)."""
    key = (module, name)
    if key in REVIEWED:
        return REVIEWED[key]
    from .catalog import inert_entry

    entry = inert_entry(module, name)
    if entry is not None:
        return f"{entry.reason} (reviewed: {entry.reviewed})"
    return "torch.load(weights_only=True) allows it" if key in WEIGHTS_ONLY else "a torch class or constant"
