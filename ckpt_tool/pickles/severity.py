"""How dangerous a pickled global is, by name alone: one table for the unpickler and the walk.

The verdict is by allowlist. ``safe``: on ckpt's inert list (pickles/inert.py:
torch's weights_only allowlist plus a short reviewed list of data types).
``dangerous``: a name known to run code or touch the system (os.system,
builtins.eval, pickle.loads, ...), whatever the pickle does with it.
``suspicious``: any other global, when the pickle only *names* it (imports it:
torch.load(weights_only=False) runs its module's import code, but never calls
it). The walk (pickles/walk/walker.py) sees how each global is used: one that an
opcode calls or constructs (REDUCE, OBJ, INST, NEWOBJ, NEWOBJ_EX, an
argument of an inert trampoline, a persistent id) and that is not inert is
``dangerous``. ckpt still reads such classes as inert placeholders.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..format_names import Name
from .inert import is_inert


class Severity(Name):
    """How dangerous a global (or a finding) is; a ``str`` Enum, so JSON and text show the plain name."""

    SAFE = "safe"
    SUSPICIOUS = "suspicious"
    DANGEROUS = "dangerous"


# The members under their short names (``severity.SAFE``), as every caller spells them.
SAFE = Severity.SAFE
SUSPICIOUS = Severity.SUSPICIOUS
DANGEROUS = Severity.DANGEROUS
# Keyed by str: a GlobalRef (model.py, below this layer) holds the plain name.
ORDER: dict[str, int] = {SAFE: 0, SUSPICIOUS: 1, DANGEROUS: 2}

# Python's builtins that are values (SAFE when named; calls of them are judged by the walk as any other).
SAFE_BUILTINS = frozenset(
    ["list", "dict", "set", "frozenset", "tuple", "bytearray", "bytes", "complex",
     "slice", "range", "int", "float", "str", "bool", "object", "Ellipsis"]
)
# Python 2 spellings that protocol 0-2 pickles use and Python 3 maps to safe builtins (_compat_pickle).
PY2_BUILTINS = frozenset(["xrange", "unicode", "long", "basestring"])

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



def function_like(name: str) -> bool:
    """A name that reads as a function or method, not a class: its last part is not Capitalised."""
    last = name.rpartition(".")[2]
    return not last[:1].isupper()


def _module_root_matches(module: str, names: frozenset[str]) -> bool:
    parts = module.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))


def severity(module: str, name: str) -> Severity:
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
        # A Python 2 name (copy_reg, __builtin__) exists only as what it maps to: unknown as itself, it is
        # judged by its mapping; a name that is also a Python 3 module is judged both ways, the worse counts.
        again = _severity(*mapped)
        verdict = again if verdict == SUSPICIOUS else worst([verdict, again])
    return verdict


def _compat(module: str, name: str) -> tuple[str, str]:
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def _severity(module: str, name: str) -> Severity:
    if "." in name and is_inert(module, name):  # a nested class the catalog reviewed under its dotted name
        return SAFE
    if "." in name:
        head, _, rest = name.partition(".")
        if any(part.startswith("_") for part in rest.split(".")) or not head:
            return DANGEROUS
        return worst([_severity(module, head), SUSPICIOUS])
    if is_inert(module, name):
        return SAFE
    if module in ("builtins", "__builtin__"):
        return SAFE if name in SAFE_BUILTINS or name in PY2_BUILTINS else (
            SUSPICIOUS if (module, name) in DILL_MAIN else DANGEROUS)
    if (module, name) in DANGEROUS_GLOBALS:
        return DANGEROUS
    if module in ("dill._dill", "dill.dill", "dill"):
        return SUSPICIOUS if name in DILL_CONSTRUCTORS and name not in DILL_DANGEROUS else DANGEROUS
    if _module_root_matches(module, DANGEROUS_MODULES):
        return DANGEROUS
    if not module or not name or not module.replace(".", "").replace("_", "").isalnum():
        return DANGEROUS
    return SUSPICIOUS


def allowable(qualname: str) -> bool:
    """Whether ``--allow-global`` may lift ``module.name``: any global but one known by name to run code."""
    module, _, name = qualname.rpartition(".")
    return bool(module) and bool(name) and severity(module, name) != DANGEROUS


def worst(severities: Iterable[str]) -> Severity:
    """The most severe of several verdicts (``safe`` for none); plain names (a GlobalRef's) count as their member."""
    return max((Severity(s) for s in severities), key=ORDER.__getitem__, default=SAFE)
