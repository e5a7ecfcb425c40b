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

# Rebuilt by the restricted unpickler itself, from ckpt_tool.pickles.rebuilders (never imported).
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
        ("torch._utils", "_rebuild_qtensor"),
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
        # TorchScript's data builders: identity functions on lists (torch/jit/_pickle.py)
        ("torch.jit._pickle", "build_intlist"),
        ("torch.jit._pickle", "build_tensorlist"),
        ("torch.jit._pickle", "build_doublelist"),
        ("torch.jit._pickle", "build_boollist"),
        ("torch.jit._pickle", "build_tensor_from_id"),
        ("torch.jit._pickle", "restore_type_tag"),
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
        "_posixsubprocess", "_winapi", "msvcrt", "winreg", "_winreg", "commands", "popen2", "spawn",
        "xmlrpc", "xmlrpclib", "ssl", "_ssl", "select", "selectors", "mmap", "fcntl", "resource",
        "termios", "tty", "logging", "zipfile", "tarfile", "shelve", "dbm", "anydbm", "gzip", "bz2",
        "lzma", "compileall", "py_compile", "site", "sysconfig", "idlelib", "tkinter", "turtle",
        "antigravity", "cgi", "cgitb", "socketserver", "SocketServer", "wsgiref", "poplib", "imaplib",
        "nntplib", "asynchat", "asyncore", "crypt", "pipes", "pwd", "grp", "spwd", "_signal", "faulthandler",
        "tracemalloc", "marshal", "_marshal", "copy", "runpy", "uuid._uuid", "nturl2path", "mailcap",
        "numpy.ctypeslib", "numpy.distutils", "numpy.lib.format", "pandas.io.pickle",
        "torch.ops", "torch._ops", "torch._C._jit_tree_views", "torch.utils.data.datapipes",
        "torch.distributed.rpc", "torch._dynamo", "torch.fx.experimental",
    ]
)
# Specific loaders and writers in otherwise harmless modules.
DANGEROUS_GLOBALS = frozenset(
    [
        ("torch", "load"), ("torch", "save"), ("torch", "from_file"), ("torch", "ops"),
        ("torch.storage", "_load_from_file"), ("torch._utils", "_import_dotted_name"),
        ("numpy", "load"), ("numpy", "loads"), ("numpy", "save"), ("numpy", "fromfile"),
        ("numpy", "memmap"), ("numpy", "loadtxt"), ("numpy", "genfromtxt"), ("numpy", "tofile"),
        ("pandas", "read_pickle"), ("pandas", "eval"), ("pandas", "read_csv"),
        ("copyreg", "_extension_registry"), ("copyreg", "add_extension"),
        ("copyreg", "_inverted_registry"), ("copyreg", "pickle"), ("copyreg", "constructor"),
    ]
)
# dill's Unpickler resolves this to the __main__ module's namespace for by-value functions.
DILL_MAIN = frozenset([("__builtin__", "__main__"), ("builtins", "__main__")])
# Inert names in otherwise dangerous modules that models carry (a ``self.logger`` pickles as
# logging.getLogger(name)): unknown, not code execution.
INERT_IN_DANGEROUS = frozenset([("logging", "getLogger"), ("logging", "Logger"), ("logging", "RootLogger")])
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
    # Python 2 spellings that protocol 0-2 pickles use and Python 3 maps to safe builtins (_compat_pickle).
    + [("__builtin__", n) for n in ("xrange", "unicode", "long", "basestring")]
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


# Functions outside SAFE_GLOBALS that checkpoints legitimately call at load time and that only build data.
INERT_CALLS = frozenset(
    [
        ("numpy.random._pickle", "__randomstate_ctor"), ("numpy.random._pickle", "__bit_generator_ctor"),
        ("numpy.random._pickle", "__generator_ctor"), ("numpy", "array"), ("numpy", "asarray"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("torch._utils", "_rebuild_qtensor"), ("torch._utils", "_rebuild_sparse_tensor"),
        ("torch._utils", "_rebuild_nested_tensor"), ("torch._utils", "_rebuild_device_tensor_from_numpy"),
        ("torch._utils", "_rebuild_wrapper_subclass"), ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"),
        ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor"), ("collections", "namedtuple"),
    ]
)


def function_like(name: str) -> bool:
    """A name that reads as a function or method, not a class: its last part is not Capitalised."""
    last = name.rpartition(".")[2]
    return not last[:1].isupper()


def _module_root_matches(module: str, names: frozenset[str]) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))


def severity(module: str, name: str) -> str:
    """Classify ``module.name`` as safe, suspicious or dangerous.

    Protocol 0-2 pickles go through ``_compat_pickle`` (``commands`` becomes
    ``subprocess``, ``__builtin__`` becomes ``builtins``), so both spellings
    are judged and the worse one counts. A dotted name (protocol 4 walks
    attributes: ``Class.method``, ``func.__globals__``) is judged by its first
    part, and is dangerous when it reaches through a private or dunder name.
    """
    verdict = _severity(module, name)
    mapped = _compat(module, name)
    if mapped != (module, name):
        verdict = worst([verdict, _severity(*mapped)])
    return verdict


def _compat(module: str, name: str) -> tuple[str, str]:
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _severity(module: str, name: str) -> str:
    if "." in name:
        head, _, rest = name.partition(".")
        if any(part.startswith("_") for part in rest.split(".")) or not head:
            return DANGEROUS
        return worst([_severity(module, head), SUSPICIOUS])
    if (module, name) in SAFE_GLOBALS or (module, name) in SAFE_CLASSES:
        return SAFE
    if (module, name) in SAFE_IN_DANGEROUS:
        return SAFE
    if (module, name) in DANGEROUS_GLOBALS:
        return DANGEROUS
    if (module, name) in DILL_MAIN or (module, name) in INERT_IN_DANGEROUS:
        return SUSPICIOUS
    if module == "torch" and (name.endswith(("Storage", "Tensor")) or _is_torch_dtype(name)):
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
    from .. import dtypes

    return name in dtypes.BY_NAME or name in (
        "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "cfloat", "cdouble", "half",
        "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
        "per_channel_affine_float_qparams",
        "float", "double", "long", "int", "short", "bool", "strided", "sparse_coo",
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
    )


def worst(severities: list[str] | tuple[str, ...]) -> str:
    """The most severe of several verdicts (``safe`` for none)."""
    return max(severities, key=ORDER.__getitem__, default=SAFE)
