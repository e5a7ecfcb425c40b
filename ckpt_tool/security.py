"""How dangerous a pickled global is: one table for the unpickler and the scanner.

``safe`` globals are the ones the restricted unpickler rebuilds itself
(tensors, storages, dtypes, plain containers) plus known inert metadata
classes; ``dangerous`` ones can run code or touch the system when called;
everything else is ``suspicious``: an unknown class that ckpt reads as an
inert placeholder.
"""
from __future__ import annotations

SAFE = "safe"
SUSPICIOUS = "suspicious"
DANGEROUS = "dangerous"
ORDER = {SAFE: 0, SUSPICIOUS: 1, DANGEROUS: 2}

# Rebuilt by ckpt_tool.unpickle itself (never imported).
SAFE_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [
        ("collections", "OrderedDict"),
        ("collections", "defaultdict"),
        ("collections", "Counter"),
        ("collections", "deque"),
        ("_codecs", "encode"),
        ("copyreg", "_reconstructor"),
        ("copy_reg", "_reconstructor"),
        ("copyreg", "__newobj__"),
        ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor_v3"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"),
        ("torch._utils", "_rebuild_meta_tensor_no_storage"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("torch._tensor", "_rebuild_from_type"),
        ("torch.nn.parameter", "Parameter"),
        ("torch", "Tensor"),
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.storage", "UntypedStorage"),
        ("torch", "UntypedStorage"),
        ("torch.storage", "TypedStorage"),
        ("torch", "TypedStorage"),
        ("torch.serialization", "_get_layout"),
        ("torch.storage", "_load_from_bytes"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
    ]
)
SAFE_BUILTINS = frozenset(
    ["list", "dict", "set", "frozenset", "tuple", "bytearray", "bytes", "complex",
     "slice", "range", "int", "float", "str", "bool", "object", "NoneType", "Ellipsis"]
)
# Inert metadata classes written by torch and friends: data holders, never code.
SAFE_MODULE_PREFIXES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "numpy.dtypes",
)
SAFE_CLASSES = frozenset(
    [
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "Path"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "timedelta"),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("uuid", "UUID"),
        ("enum", "Enum"),
    ]
)

DANGEROUS_MODULES = frozenset(
    [
        "os", "posix", "nt", "posixpath", "ntpath", "subprocess", "sys", "runpy", "importlib",
        "pickle", "_pickle", "cPickle", "dill", "marshal", "shutil", "socket", "_socket",
        "webbrowser", "requests", "urllib", "urllib2", "http", "httplib", "ftplib", "telnetlib",
        "smtplib", "ctypes", "_ctypes", "multiprocessing", "code", "codeop", "pty", "asyncio",
        "signal", "tempfile", "io", "_io", "platform", "pip", "setuptools", "distutils",
        "imp", "zipimport", "pkgutil", "inspect", "gc", "threading", "_thread", "types",
        "joblib", "cloudpickle", "pydoc", "timeit", "trace", "bdb", "pdb", "profile",
        "cProfile", "ensurepip", "venv", "sqlite3", "glob", "fileinput", "linecache",
        "torch.hub", "torch.jit", "torch.utils.cpp_extension", "torch._dynamo", "torch._inductor",
        "torch.serialization", "torch.package", "numpy.testing", "numpy.f2py", "numpy.lib.npyio",
        "operator", "functools", "builtins", "__builtin__", "_operator", "_functools",
    ]
)
DANGEROUS_BUILTINS = frozenset(
    ["exec", "eval", "compile", "open", "__import__", "getattr", "setattr", "delattr",
     "globals", "locals", "vars", "input", "breakpoint", "exit", "quit", "help", "execfile",
     "file", "reload", "apply", "memoryview", "type", "super", "classmethod", "staticmethod",
     "property", "dir", "print", "iter", "next", "map", "filter", "reversed", "sorted",
     "enumerate", "zip", "callable", "hasattr", "isinstance", "issubclass", "id", "hash"]
)
# Globals inside otherwise-dangerous modules that are plain data.
SAFE_IN_DANGEROUS = frozenset(
    [("builtins", n) for n in SAFE_BUILTINS]
    + [("__builtin__", n) for n in SAFE_BUILTINS]
    + [("torch.serialization", "_get_layout")]
)
# dill's by-value helpers build classes, functions and code objects without
# running them; the ones that import or look up attributes are dangerous.
DILL_CONSTRUCTORS = frozenset(
    ["_create_type", "_create_function", "_create_code", "_create_cell", "_load_type",
     "_create_namedtuple", "_create_array", "_create_dtypemeta", "_create_filehandle",
     "_create_lock", "_create_rlock", "_create_weakref", "_create_weakproxy",
     "_get_attr_dummy", "_create_ftype", "_setattr_dummy", "_create_code_dummy"]
)
DILL_DANGEROUS = frozenset(["_import_module", "_get_attr", "_eval_repr", "_setattr",
                            "_create_filehandle"])


def _module_root_matches(module: str, names: frozenset[str]) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))


def severity(module: str, name: str) -> str:
    """Classify ``module.name`` as safe, suspicious or dangerous."""
    if (module, name) in SAFE_GLOBALS or (module, name) in SAFE_CLASSES:
        return SAFE
    if (module, name) in SAFE_IN_DANGEROUS:
        return SAFE
    if module == "torch" and (name.endswith("Storage") or _is_torch_dtype(name)):
        return SAFE
    if module.startswith(SAFE_MODULE_PREFIXES):
        return SAFE
    if module in ("dill._dill", "dill.dill", "dill"):
        if name in DILL_DANGEROUS:
            return DANGEROUS
        if name in DILL_CONSTRUCTORS:
            return SUSPICIOUS
        return DANGEROUS
    if module in ("builtins", "__builtin__"):
        return DANGEROUS if name in DANGEROUS_BUILTINS or name not in SAFE_BUILTINS else SAFE
    if _module_root_matches(module, DANGEROUS_MODULES):
        return DANGEROUS
    if not module or not name or not module.replace(".", "").replace("_", "").isalnum():
        return DANGEROUS
    return SUSPICIOUS


def _is_torch_dtype(name: str) -> bool:
    from . import dtypes

    return name in dtypes.BY_NAME or name in (
        "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "cfloat", "cdouble", "half",
        "float", "double", "long", "int", "short", "bool", "strided", "sparse_coo",
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    )


def worst(severities: list[str] | tuple[str, ...]) -> str:
    """The most severe of several verdicts (``safe`` for none)."""
    return max(severities, key=ORDER.__getitem__, default=SAFE)
