"""Enumerate the globals a pickle could name in the standard library and torch that only store data.

Run from the repository root with the pinned torch installed:

    python tools/catalog_candidates.py            # candidates not yet decided in the catalog
    python tools/catalog_candidates.py --all      # every candidate, with the machine's hint

A candidate is a class defined in one of MODULES that is an Enum, a NamedTuple or
structseq, or a dataclass, and whose construction as pickle performs it
(``copyreg.__newobj__`` / REDUCE of the class with its fields, then BUILD as a
``__dict__`` update) runs none of its own code: no ``__setstate__``,
``__reduce__``, ``__reduce_ex__``, ``__new__`` or ``__init_subclass__`` of its
own beyond what enum, dataclasses and namedtuple generate. The hint is what
the machine saw; the decision and reason in ckpt_tool/pickles/catalog/ are a
person's, made after reading the class (tests/pickles/test_catalog.py then
unpickles each inert entry in an audited subprocess).
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import sys
import warnings

MODULES = (
    "re", "datetime", "decimal", "fractions", "uuid", "pathlib", "collections", "argparse", "types",
    "ipaddress", "enum",
    "torch.return_types", "torch.nn.utils.rnn",
    "torch.distributed.fsdp.api", "torch.distributed.fsdp._fully_shard._fsdp_api",
    "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.state_dict", "torch.distributed.checkpoint.stateful",
    "torch.distributed.tensor.placement_types", "torch.distributed.tensor._dtensor_spec",
    "torch.distributed._shard.metadata", "torch.distributed._shard.sharded_tensor.metadata",
    "torch.distributed._shard.sharded_tensor.shard", "torch.distributed._shard.sharding_spec.chunk_sharding_spec",
    "torch.ao.quantization.qconfig", "torch.ao.quantization.observer", "torch.ao.quantization.fake_quantize",
    "torch.amp.grad_scaler",
)
# Third-party modules whose Enums, NamedTuples and dataclasses are enumerated when the library is installed
# (the catalog's third_party.py decides them, for the version its review names).
THIRD_PARTY = (
    "transformers.training_args", "transformers.training_args_seq2seq", "transformers.trainer_utils",
    "transformers.trainer_pt_utils", "transformers.debug_utils", "accelerate.utils.dataclasses",
    "omegaconf.base", "lightning_fabric.utilities.data",
    "torchao.quantization.granularity", "torchao.quantization.quant_primitives",
    "torchao.quantization.quantize_.common.kernel_preference",
    "torchao.quantization.quantize_.workflows.int8.int8_tensor",
    "torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor",
    "torchao.quantization.quantize_.workflows.float8.float8_tensor",
)
_OWN = ("__setstate__", "__reduce__", "__reduce_ex__", "__new__", "__getstate__")


def _kind(obj: type) -> str | None:
    if isinstance(obj, enum.EnumMeta):
        return "enum"
    if issubclass(obj, tuple) and hasattr(obj, "_fields"):
        return "namedtuple"
    if issubclass(obj, tuple) and hasattr(obj, "n_fields"):
        return "structseq"
    if dataclasses.is_dataclass(obj):
        return "dataclass"
    return None


def _generated(fn: object) -> bool:
    """A hook enum, namedtuple or a C structseq generates (not code the class's authors wrote)."""
    fn = getattr(fn, "__func__", fn)  # a staticmethod's function
    code = getattr(fn, "__code__", None)
    if getattr(fn, "__module__", None) == "enum":
        return True  # Enum.__new__: looks a member up by value
    if code is not None:
        return code.co_filename == "<string>"  # namedtuple's __new__: tuple.__new__(cls, (fields))
    return type(fn).__name__ in ("method_descriptor", "builtin_function_or_method", "wrapper_descriptor")


def _own_hooks(cls: type) -> list[str]:
    """Pickle hooks ``cls`` or a base of it defines that run its authors' code (not enum's, tuple's, object's)."""
    found = []
    for klass in cls.__mro__:
        if klass.__module__ in ("builtins", "enum", "collections", "typing", "abc"):
            continue
        found += [f"{klass.__qualname__}.{h}" for h in _OWN if h in vars(klass) and not _generated(vars(klass)[h])]
    return found


def candidates() -> list[tuple[str, str, str, str]]:
    """(module, name, kind, hint) for every candidate class of MODULES."""
    out = []
    seen: set[tuple[str, str]] = set()
    warnings.simplefilter("ignore")
    for modname in (*MODULES, *THIRD_PARTY):
        try:
            with warnings.catch_warnings():
                mod = importlib.import_module(modname)
        except ImportError as exc:
            print(f"# {modname}: not importable ({exc})", file=sys.stderr)
            continue
        for name, obj in sorted(vars(mod).items()):
            # a class defined here, named as a pickle names it (its __module__, which a package may set)
            if not inspect.isclass(obj) or name.startswith("__") or name != obj.__qualname__ or \
                    not (obj.__module__ == modname or modname.startswith(obj.__module__ + ".")):
                continue
            if (obj.__module__, name) in seen:
                continue
            seen.add((obj.__module__, name))
            modname_of = obj.__module__
            kind = _kind(obj)
            if kind is None:
                continue
            hooks = _own_hooks(obj)
            hint = f"{kind}; own pickle hooks: {', '.join(hooks)}" if hooks else f"{kind}; no pickle hooks of its own"
            out.append((modname_of, name, kind, hint))
    out += _nn_modules(seen)
    return out


def _nn_modules(seen: set[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """torch.nn's exported modules (whole-model pickles construct them), with their own pickle hooks."""
    import torch.nn as nn

    out = []
    for name in sorted(dir(nn)):
        obj = getattr(nn, name)
        if inspect.isclass(obj) and issubclass(obj, nn.Module) and obj.__qualname__ == name:
            if (obj.__module__, name) in seen:
                continue
            seen.add((obj.__module__, name))
            hooks = [h for h in _own_hooks(obj) if not h.startswith("Module.")]
            hint = f"nn.Module; own pickle hooks: {', '.join(hooks)}" if hooks else "nn.Module; Module.__setstate__"
            out.append((obj.__module__, name, "nn.Module", hint))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list decided candidates too")
    args = parser.parse_args(argv)
    sys.path.insert(0, ".")
    from ckpt_tool.pickles.catalog import CATALOG
    from ckpt_tool.pickles.inert import REVIEWED

    missing = 0
    for module, name, _, hint in candidates():
        decided = CATALOG.get((module, name))
        state = decided.decision if decided else ("inert (inert.REVIEWED)" if (module, name) in REVIEWED else None)
        if state is None:
            missing += 1
        if state is None or args.all:
            state = state or "UNDECIDED"
            print(f"{state:10} {module}.{name}: {hint}")
    print(f"# {missing} undecided", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
