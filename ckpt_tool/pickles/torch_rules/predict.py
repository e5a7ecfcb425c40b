"""Will ``torch.load(weights_only=True)`` load this file, and what must be allowlisted if not?

A torch-free model of ``torch/_weights_only_unpickler.py`` and of the format
checks in ``torch.serialization.load``, for torch 2.4 (``add_safe_globals``
appeared) to 2.13, as data keyed by the version where each rule changed
(``CHANGES``). Nothing here imports torch or NumPy, or runs the pickle.

Design
------
``predict(pickles, torch_version=None, container="zip") -> WeightsOnlyVerdict``

* ``pickles``: one ``PickleFacts`` per pickle that torch.load unpickles (a zip
  checkpoint: ``data.pkl``; the legacy format: its five pickles).
  ``facts_from_pickle(bytes)`` computes them with ``pickletools``; the static
  walker (``pickles/walk``) should fill the same fields in its one pass:
  ``protocol``; ``opcodes`` (pickletools names of every opcode seen);
  ``globals`` (raw (module, name) of each GLOBAL/constant STACK_GLOBAL, first
  use order); ``calls`` (each REDUCE/NEWOBJ/NEWOBJ_EX/OBJ/INST as an ``Obj``:
  the callee global, or None when the callee is not a global, and its first
  positional argument when it is a constant str or a global); ``builds``,
  ``setitems``, ``appends`` (the object each BUILD, SETITEM(S),
  APPEND(S)/ADDITEMS acts on: ``Obj("dict"|"list"|"set"|"tuple"|"const"|
  "global"|"unknown")`` or the ``Obj("call", ...)`` that made it);
  ``persistent_ids`` (the first element of each persistent id when it is a
  constant str, else ``"?"``); ``error`` (the pickle is malformed).
* ``container``: "zip", "legacy", "torchscript", "tar" or "pickle" (a plain
  pickle or dill file: torch.load reads it as the legacy format and refuses
  it for its missing magic number, after its weights_only unpickler has
  judged the pickle).
* The verdict: ``loads``; ``needs``, sorted "module.name" strings to pass to
  ``torch.serialization.add_safe_globals``/``safe_globals`` (names as in the
  pickle after torch's py2 name mapping, plus types torch checks that the
  pickle never names: ``numpy.dtypes.Float64DType`` for a NumPy dtype's BUILD);
  ``torch``, the version whose rules were applied; ``reason``, set when no
  allowlisting makes the file load under those rules (an opcode torch refuses,
  a blocked module, SETITEM on a dict subclass since 2.10, a TorchScript
  archive since 2.6, ...); ``default_weights_only``, whether that version's
  ``torch.load`` uses weights_only when not told (2.6+), which is what a gate
  on "the default load of a deployment" checks.

Hooking in: inspect, diff (per side) and gate put
``{"loads": v.loads, "needs": list(v.needs), "torch": v.torch}`` (plus
``reason`` when set) under the JSON key ``weights_only``; gate's
``weights-only`` check fails when ``v.default_weights_only and not v.loads``
after removing the policy's allowed globals from ``needs``.

Allowlisting a name works when the object passed has that
``__module__.__qualname__`` (``__name__`` before 2.7); otherwise (NumPy 1.x
files read with NumPy 2: ``numpy.core.multiarray.*`` objects now say
``numpy._core``; a ``__main__`` class) pass ``(obj, "module.name")`` (2.6+).
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from .facts import Obj, Pair, PickleFacts, facts_from_pickle


@dataclass(frozen=True)
class WeightsOnlyVerdict:
    loads: bool
    needs: tuple[str, ...]
    torch: str
    reason: str | None = None
    default_weights_only: bool = True
    applies: bool = True  # False: torch.load is not how the input is read (a DCP folder, ...); ``reason`` says why


@dataclass(frozen=True)
class Rules:
    """torch's weights_only behaviour from one minor version on."""

    version: tuple[int, int]
    allowed: frozenset[str]
    newobj_on_default_allowed: bool  # NEWOBJ may build default-allowed classes, not only Parameter/user ones
    build_on_default_allowed: bool  # BUILD may act on instances of default-allowed classes
    map_names_any_protocol: bool  # py2 name mapping applies whatever the PROTO (2.4: only protocol 2)
    setitem_only_dicts: bool  # SETITEM(S) only on dict/OrderedDict/Counter (CVE-2026-24747 fix)
    # weights_only on a TorchScript zip raises (before: torch.jit.load ran it, CVE-2025-32434)
    refuses_torchscript: bool
    refuses_tar: bool  # the torch 0.1 tar format is refused
    default_weights_only: bool  # torch.load's default
    reads_safetensors: bool = False  # a path ending in .safetensors goes to safetensors.torch.load_file


# ---- the allowlist of torch 2.4 (_get_allowed_globals), then what each version added
_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex32",
    "complex64", "complex128", "qint8", "quint8", "qint32", "quint4x2", "quint2x4", "uint16", "uint32", "uint64",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz",
    "float8_e4m3fnuz"]
_SCALAR_NAMES = ["Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"]
_TENSOR_CLASSES = [
    *(f"torch.{n}Tensor" for n in _SCALAR_NAMES), *(f"torch.cuda.{n}Tensor" for n in _SCALAR_NAMES),
    *(f"torch.{m}.{n}Tensor" for m in ("sparse", "cuda.sparse") for n in _SCALAR_NAMES if n != "Bool")]
_STORAGES = [f"torch.{n}Storage" for n in [*_SCALAR_NAMES, "ComplexDouble", "ComplexFloat", "QUInt8", "QInt8",
                                           "QInt32", "QUInt4x2", "QUInt2x4"]]
_STORAGES += [f"torch.cuda.{n}Storage" for n in [*_SCALAR_NAMES, "ComplexDouble", "ComplexFloat"]]
_REBUILD_2_4 = [
    "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_tensor",
    "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor", "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor", "_rebuild_wrapper_subclass", "_rebuild_device_tensor_from_numpy"]
_BASE = frozenset(
    ["collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter",
     "torch.serialization._get_layout", "torch.Size", "torch.Tensor", "torch.device", "_codecs.encode",
     "builtins.bytearray", "torch.storage.TypedStorage", "torch.storage.UntypedStorage",
     "torch._tensor._rebuild_from_type_v2"]
    + [f"torch.{d}" for d in _DTYPES] + _TENSOR_CLASSES + _STORAGES
    + [f"torch.{q}" for q in [
        "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
        "per_channel_affine_float_qparams"]]
    + [f"torch._utils.{f}" for f in _REBUILD_2_4]
)
# (version, changes): each Rules field that changed, and names added to the allowlist.
_FIRST = Rules(version=(2, 4), allowed=_BASE, newobj_on_default_allowed=False, build_on_default_allowed=False,
               map_names_any_protocol=False, setitem_only_dicts=False, refuses_torchscript=False,
               refuses_tar=False, default_weights_only=False)
# (version, names added to the allowlist, Rules fields that changed), oldest first.
CHANGES: tuple[tuple[tuple[int, int], tuple[str, ...], dict[str, bool]], ...] = (
    ((2, 5), ("builtins.set", "torch._utils._rebuild_device_tensor_from_cpu_tensor"),
     {"newobj_on_default_allowed": True, "build_on_default_allowed": True, "map_names_any_protocol": True}),
    # 2.6: weights_only=True by default; CVE-2025-32434 fixed (TorchScript and tar refused); add_safe_globals
    # takes (obj, "module.name") tuples. builtins.complex and torch.int1-7/uint1-7 landed for 2.6 as far as
    # the source history shows (not executed here).
    ((2, 6), ("builtins.complex", *(f"torch.{p}int{i}" for p in ("", "u") for i in range(1, 8))),
     {"refuses_torchscript": True, "refuses_tar": True, "default_weights_only": True}),
    # torch's allowlist holds every dtype of its storage._new_dtypes(), so a dtype joins it with the release
    # that adds it: float8_e8m0fnu in 2.7 (pytorch#147466, Feb 2025), float4_e2m1fn_x2 in 2.8 (pytorch#146578;
    # absent from 2.7.1, as NVIDIA/Fuser#4683 notes). Before, a pickle naming them is refused (no such global).
    ((2, 7), ("torch.float8_e8m0fnu",), {}),
    ((2, 8), ("torch.float4_e2m1fn_x2",), {}),
    ((2, 10), (), {"setitem_only_dicts": True}),  # CVE-2026-24747 fix (SETITEM(S) target check)
    ((2, 13), (), {"reads_safetensors": True}),  # pytorch#170592 (seen in 2.13's torch.serialization.load)
)
NEWEST = (2, 13)


def _build_table() -> dict[tuple[int, int], Rules]:
    table: dict[tuple[int, int], Rules] = {}
    current = _FIRST
    changes = {version: (added, fields) for version, added, fields in CHANGES}
    for minor in range(4, NEWEST[1] + 1):
        added, fields = changes.get((2, minor), ((), {}))
        current = replace(current, version=(2, minor), allowed=current.allowed | frozenset(added), **fields)
        table[(2, minor)] = current
    return table


TABLE = _build_table()

# torch._utils.IMPORT_MAPPING / NAME_MAPPING (a subset of _compat_pickle's)
IMPORT_MAPPING = {"__builtin__": "builtins", "copy_reg": "copyreg", "Queue": "queue", "repr": "reprlib",
                  "_abcoll": "collections.abc", "UserDict": "collections", "UserList": "collections",
                  "UserString": "collections", "whichdb": "dbm", "StringIO": "io", "cStringIO": "io"}
NAME_MAPPING = {
    ("__builtin__", "xrange"): ("builtins", "range"), ("__builtin__", "reduce"): ("functools", "reduce"),
    ("__builtin__", "intern"): ("sys", "intern"), ("__builtin__", "unichr"): ("builtins", "chr"),
    ("__builtin__", "unicode"): ("builtins", "str"), ("__builtin__", "long"): ("builtins", "int"),
    ("itertools", "izip"): ("builtins", "zip"), ("itertools", "imap"): ("builtins", "map"),
    ("itertools", "ifilter"): ("builtins", "filter"), ("itertools", "ifilterfalse"): ("itertools", "filterfalse"),
    ("itertools", "izip_longest"): ("itertools", "zip_longest"),
    (
        "UserDict", "IterableUserDict"): ("collections", "UserDict"), ("UserList", "UserList"): ("collections",
        "UserList"),
    ("UserString", "UserString"): ("collections", "UserString"), ("__builtin__", "basestring"): ("builtins", "str"),
    ("exceptions", "StandardError"): ("builtins", "Exception"), ("UserDict", "UserDict"): ("collections", "UserDict"),
}
BLOCKED_MODULES = frozenset(["sys", "os", "posix", "nt"])  # refused even when allowlisted
SUPPORTED_OPCODES = frozenset(
    [
        "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK", "TUPLE", "TUPLE1",
        "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET",
        "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID", "BINGET",
        "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1", "PROTO", "STOP"]
)  # the same set in 2.4-2.13: no protocol 4+ opcodes (STACK_GLOBAL, FRAME, MEMOIZE, ...), POP, DUP, LONG4, BINBYTES
_BUILD_ALWAYS = frozenset(["torch.Tensor", "torch.nn.parameter.Parameter", "collections.OrderedDict"])
_SETITEM_TYPES = frozenset(["collections.OrderedDict", "collections.Counter"])
# What numpy.dtype(arg) returns (numpy >= 1.25, LP64): BUILD then checks that class.
_NP_DTYPES = {"b1": "Bool", "i1": "Int8", "u1": "UInt8", "i2": "Int16", "u2": "UInt16", "i4": "Int32",
              "u4": "UInt32", "i8": "Int64", "u8": "UInt64", "f2": "Float16", "f4": "Float32", "f8": "Float64",
              "f12": "LongDouble", "f16": "LongDouble", "c8": "Complex64", "c16": "Complex128",
              "c24": "CLongDouble", "c32": "CLongDouble", "O4": "Object", "O8": "Object", "M8": "DateTime64",
              "m8": "TimeDelta64"}
_NP_FLEXIBLE = {"S": "Bytes", "U": "Str", "V": "Void"}
_BUILTIN_CLASSES = frozenset([
    "set", "frozenset", "bytearray", "bytes", "complex", "slice", "range", "dict", "list", "tuple", "int", "float",
    "str", "bool", "object"])
_TENSOR_MAKERS = frozenset(f"torch._utils.{f}" for f in ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3"))


PLAIN_PICKLE = ("a plain pickle, not a torch.save file: torch.load reads it as the legacy format and refuses it "
                "('Invalid magic number'); convert it with ckpt migrate")


@functools.cache
def torch_version_default() -> str:
    """The installed torch's version, else the newest known.

    Read from ``torch/version.py`` as found on the path: importing torch costs
    a second, and importlib.metadata alone ~40 ms on every inspect.
    """
    import importlib.util

    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
                found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
        except OSError:
            continue
        if found:
            return found.group(1)
    return ".".join(map(str, NEWEST))


def rules_for(version: str | None) -> Rules:
    """The rules of ``version`` ("2.6.0+cpu"); older than 2.4 or newer than the newest known: the nearest."""
    text = version or torch_version_default()
    try:
        major, minor = (int("".join(c for c in part if c.isdigit()) or "x") for part in text.split(".")[:2])
    except ValueError:
        raise ValueError(f"not a torch version: {text!r}") from None
    key = min(max((major, minor), (2, 4)), NEWEST)
    return TABLE[key]


def _map(pair: Pair, protocol: int, rules: Rules) -> str:
    module, name = pair
    if rules.map_names_any_protocol or protocol == 2:
        if pair in NAME_MAPPING:
            module, name = NAME_MAPPING[pair]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
    return f"{module}.{name}"


def torch_name(pair: Pair, protocol: int, rules: Rules) -> str:
    """``module.name`` as torch's weights_only unpickler looks it up (after its py2 name mapping)."""
    return _map(pair, protocol, rules)


def _result_type(obj: Obj, protocol: int, rules: Rules) -> str | None:
    """The type of the object a REDUCE/NEWOBJ made, where it can be known statically."""
    if obj.name is None:
        return None
    callee = _map(obj.name, protocol, rules)
    if obj.opcode != "REDUCE":
        return callee  # NEWOBJ: cls.__new__(cls)
    if callee == "numpy.dtype":
        arg = obj.arg or ""
        cls = _NP_DTYPES.get(arg) or (_NP_FLEXIBLE.get(arg[:1]) if arg[1:].isdigit() or arg[1:] == "" else None)
        return f"numpy.dtypes.{cls}DType" if cls else None
    if callee.endswith("multiarray._reconstruct") or callee == "copyreg._reconstructor":
        return _map(obj.arg_global, protocol, rules) if obj.arg_global else None
    if callee in _TENSOR_MAKERS:
        return "torch.Tensor"
    if callee.startswith("torch._utils._rebuild_parameter"):
        return "torch.nn.parameter.Parameter"
    module, _, name = callee.rpartition(".")
    if module == "builtins":
        return callee if name in _BUILTIN_CLASSES else None
    # Otherwise taken to be a class whose instance is made (an Enum member is of its class): a function whose
    # result gets a BUILD is rare outside the cases above, and is refused by torch unless its type is allowlisted.
    return callee


def _describe(target: Obj, kind: str | None, protocol: int, rules: Rules) -> str:
    if target.kind != "call":
        return f"a {target.kind}" if target.kind != "unknown" else "an object built at load time"
    if target.name is None:
        return "an object built at load time"
    return f"a {kind}" if kind else f"the result of {_map(target.name, protocol, rules)}"


def _check_pickle(facts: PickleFacts, rules: Rules, needs: set[str]) -> str | None:
    """Add what ``facts`` needs allowlisted to ``needs``; return why it can never load, if so.

    Every global outside the allowlist is in ``needs``, also when the pickle
    can never load (torch may name any of them first); the fix is only
    offered when there is no reason. The steps run in the unpickler's order
    of refusals, and the first reason found is the answer.
    """
    reason = _globals_reason(facts, rules, needs)
    if reason is not None:
        return reason
    return (_persistent_reason(facts) or _calls_reason(facts, rules, needs)
            or _builds_reason(facts, rules, needs) or _items_reason(facts, rules))


def _globals_reason(facts: PickleFacts, rules: Rules, needs: set[str]) -> str | None:
    """A malformed pickle, a refused opcode or a blocked module; every global not allowed goes to ``needs``."""
    reason = f"the pickle is malformed ({facts.error})" if facts.error else None
    bad = sorted(facts.opcodes - SUPPORTED_OPCODES)
    if bad:
        reason = reason or (f"opcode(s) {', '.join(bad)} are refused by the weights_only unpickler "
                            f"(protocol {facts.protocol})")
    proto = facts.protocol
    for pair in facts.globals:
        full = _map(pair, proto, rules)
        module = IMPORT_MAPPING.get(pair[0], pair[0]) if pair not in NAME_MAPPING else NAME_MAPPING[pair][0]
        if module in BLOCKED_MODULES:
            reason = reason or f"global {full} is in a module torch blocks even when allowlisted"
        if full not in rules.allowed:
            needs.add(full)
    return reason


def _persistent_reason(facts: PickleFacts) -> str | None:
    """Before the calls: a legacy module's class comes from its persistent id."""
    for pid in facts.persistent_ids:
        if pid != "storage":
            return f"persistent id {pid!r}: only storages may be loaded by persistent id"
    return None


def _calls_reason(facts: PickleFacts, rules: Rules, needs: set[str]) -> str | None:
    proto = facts.protocol
    for call in facts.calls:
        if call.name is None:
            return f"{call.opcode} calls an object built at load time, which is never allowlisted"
        callee = _map(call.name, proto, rules)
        if callee not in rules.allowed:
            needs.add(callee)  # a nested class reached by getattr is checked by identity, so it is needed too
        elif call.opcode == "NEWOBJ" and callee != "torch.nn.parameter.Parameter" \
                and not rules.newobj_on_default_allowed:
            needs.add(callee)  # 2.4: NEWOBJ builds Parameter or user-allowlisted classes only
    return None


def _builds_reason(facts: PickleFacts, rules: Rules, needs: set[str]) -> str | None:
    proto = facts.protocol
    for target in facts.builds:
        kind = _result_type(target, proto, rules) if target.kind == "call" else None
        if kind is None:
            return (f"BUILD sets the state of {_describe(target, kind, proto, rules)}, whose type cannot be "
                    "allowlisted (or is not known statically)")
        if kind in _BUILD_ALWAYS or (rules.build_on_default_allowed and kind in rules.allowed):
            continue
        needs.add(kind)
    return None


def _items_reason(facts: PickleFacts, rules: Rules) -> str | None:
    """SETITEM(S) and APPEND(S) on what torch's unpickler accepts them on."""
    proto = facts.protocol
    if rules.setitem_only_dicts:
        for target in facts.setitems:
            kind = _result_type(target, proto, rules) if target.kind == "call" else target.kind
            if kind not in _SETITEM_TYPES and kind != "dict":
                return (f"SETITEM(S) on {_describe(target, kind, proto, rules)}: since torch 2.10 only dict, "
                        "OrderedDict and Counter take items (dict subclasses such as defaultdict never load)")
    for target in facts.appends:
        kind = _result_type(target, proto, rules) if target.kind == "call" else target.kind
        if kind not in ("list", "builtins.list"):
            return f"APPEND(S) on {_describe(target, kind, proto, rules)}: only plain lists can be appended to"
    return None


def predict(
    pickles: PickleFacts | Iterable[PickleFacts],
    torch_version: str | None = None,
    container: str = "zip",
) -> WeightsOnlyVerdict:
    """Say whether ``torch.load(path, weights_only=True)`` of ``torch_version`` loads the file."""
    rules = rules_for(torch_version)
    version = f"{rules.version[0]}.{rules.version[1]}"
    verdict = WeightsOnlyVerdict(True, (), version, None, rules.default_weights_only)
    if container == "torchscript":
        if rules.refuses_torchscript:
            return replace(verdict, loads=False, reason="a TorchScript archive: torch.load(weights_only=True) "
                           "refuses it since 2.6 (load it with torch.jit.load if trusted)")
        return verdict  # before 2.6 torch.load handed it to torch.jit.load, weights_only or not (CVE-2025-32434)
    if container == "tar" and rules.refuses_tar:
        return replace(verdict, loads=False, reason="the torch 0.1 tar format: refused under weights_only since 2.6")
    needs: set[str] = set()
    reason = None
    for facts in [pickles] if isinstance(pickles, PickleFacts) else pickles:
        reason = reason or _check_pickle(facts, rules, needs)
    if container == "pickle":
        reason = reason or PLAIN_PICKLE
    return replace(verdict, loads=not needs and reason is None, needs=tuple(sorted(needs)), reason=reason)


__all__ = [
    "CHANGES",
    "TABLE",
    "Obj",
    "PickleFacts",
    "Rules",
    "WeightsOnlyVerdict",
    "facts_from_pickle",
    "predict",
    "rules_for",
    "torch_name",
    "torch_version_default",
]
