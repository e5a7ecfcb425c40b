"""What the format readers keep for the weights_only prediction, and the prediction for a whole input.

The readers unpickle every pickle ``torch.load`` would unpickle anyway. While
they do, the opcode guard records the opcodes outside ``guard.QUIET`` and the
restricted unpickler the globals: these *cheap facts* cost nothing on a
torch.save pickle of any size, and decide the prediction alone when

* the pickle holds an opcode torch's weights_only unpickler refuses, or a
  global in a module it blocks (it never loads, whatever else is in it), or
* it names only ``STANDARD`` globals (tensor rebuilds, storages, dtypes,
  OrderedDict, ...), has no NEWOBJ, and no list where a SETITEM could hit one
  (torch >= 2.10 refuses that). Then every REDUCE, BUILD, SETITEM(S) and
  APPEND(S) that ckpt's own unpickler accepted acts on an object torch
  accepts too: the stand-ins for those globals are not callable, take no
  items and hold no state, as torch's objects.

Otherwise (an unknown class, a NumPy dtype whose BUILD torch checks by its
type, a list next to SETITEM, and every pickle of at most ``SMALL_PICKLE``
bytes, so that hand-made pickles always get the exact answer) the pickle's
bytes are kept and the symbolic walk (wo_facts.py) runs once, when a command
asks for the prediction. The 21 MB ``data.pkl`` of a 200,000-tensor state_dict
is decided by its cheap facts; the walk would take about 9 s.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ... import dtypes
from ...model import GlobalRef
from ..severity import DANGEROUS
from .facts import Pair
from .predict import (
    BLOCKED_MODULES,
    SUPPORTED_OPCODES,
    TABLE,
    PickleFacts,
    WeightsOnlyVerdict,
    facts_from_pickle,
    predict,
    rules_for,
    torch_name,
)

MAX_ZIP_VERSION = 10  # caffe2::serialize::kMaxSupportedFileFormatVersion (torch 2.4 to 2.13)
SMALL_PICKLE = 64 << 10  # bytes: a pickle this small always gets the exact symbolic walk (~20 ms at most)

_TENSOR_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
                    "_rebuild_parameter_with_state", "_rebuild_meta_tensor_no_storage")
STANDARD = frozenset(
    ["collections.OrderedDict", "collections.Counter", "_codecs.encode", "builtins.set", "builtins.complex",
     "torch.Size", "torch.device", "torch.serialization._get_layout", "torch.storage.UntypedStorage"]
    + [f"torch._utils.{f}" for f in _TENSOR_REBUILDS]
    + [f"torch.{n}" for n in list(dtypes.BY_NAME) + list(dtypes.BY_STORAGE)]
) & TABLE[max(TABLE)].allowed  # only what torch allows: a STANDARD pickle needs nothing allowlisted

# containers (WeightsOnlyInput.container)
ZIP, TORCHSCRIPT, LEGACY, TAR, PICKLE, SAFETENSORS, SHARDED, OTHER = (
    "zip", "torchscript", "legacy", "tar", "pickle", "safetensors", "sharded", "other")


@functools.cache
def _opcode_names() -> dict[int, str]:
    import pickletools  # 2 ms: only when a pickle held an opcode worth naming

    return {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}


@dataclass(frozen=True)
class PickleInput:
    """One pickle torch.load would unpickle: its cheap facts, and its bytes when they may be needed."""

    protocol: int
    opcodes: frozenset[str]  # pickletools names of the opcodes the guard recorded (outside guard.QUIET)
    globals: tuple[Pair, ...]  # every global the pickle names, first use first
    persistent_ids: tuple[str, ...] = ()  # kinds other than "storage" ("module" in legacy whole-model files)
    data: bytes | None = field(default=None, repr=False)
    changed: bool = False  # reading it changed a stand-in (BUILD on a global): only the walk can judge it
    _walked: list[PickleFacts] = field(default_factory=list, compare=False, repr=False)

    def facts(self) -> PickleFacts:
        """The exact facts (the symbolic walk, run once); the cheap ones when the bytes were not kept."""
        if self.data is None:
            return self.cheap_facts()
        if not self._walked:
            self._walked.append(facts_from_pickle(self.data))
        return self._walked[0]

    def cheap_facts(self) -> PickleFacts:
        return PickleFacts(self.protocol, self.opcodes, self.globals, persistent_ids=self.persistent_ids)


def pickle_input(data: bytes | None, opcodes: Iterable[int], globals_: Iterable[Pair],
                 persistent_ids: Sequence[str] = (), *, changed: bool = False) -> PickleInput:
    """Cheap facts of one pickle, keeping ``data`` when some torch version's answer may need the walk.

    A small pickle's bytes are always kept, even when the cheap facts decide:
    formats/checkpoint/findings.py walks them for SETITEM(S) on a non-dict (CVE-2026-24747).
    """
    seen = tuple(opcodes)
    names = _opcode_names() if seen else {}
    ops = frozenset(names.get(op, f"<unknown opcode {op:#04x}>") for op in seen)
    protocol = data[1] if data is not None and len(data) > 1 and data[0] == 0x80 else 0
    p = PickleInput(protocol, ops, tuple(dict.fromkeys(globals_)), tuple(persistent_ids), changed=changed)
    keep = data is not None and (len(data) <= SMALL_PICKLE or changed or (not _refused(p) and (
        bool(ops & {"NEWOBJ", "EMPTY_LIST"}) or any(f"{m}.{n}" not in STANDARD for m, n in p.globals))))
    return replace(p, data=data) if keep else p


def _refused(p: PickleInput) -> bool:
    """Refused by every version whatever else the pickle holds: the cheap facts say it all."""
    return bool(p.opcodes - SUPPORTED_OPCODES) or any(m.split(".")[0] in BLOCKED_MODULES for m, _ in p.globals)


def _decided_cheaply(p: PickleInput, protocol_rules: Any) -> bool:
    if _refused(p):
        return True
    if p.data is None:
        return True  # pickle_input kept no bytes: the cheap facts decide under every version's rules
    if len(p.data) <= SMALL_PICKLE or p.changed or "NEWOBJ" in p.opcodes:
        return False
    if protocol_rules.setitem_only_dicts and "EMPTY_LIST" in p.opcodes:
        return False
    return all(torch_name(g, p.protocol, protocol_rules) in STANDARD for g in p.globals)


def pickle_facts(p: PickleInput, torch_version: str | None = None) -> PickleFacts:
    """The facts predict() needs for ``p`` under ``torch_version``'s rules: cheap when they decide, else walked."""
    return p.cheap_facts() if _decided_cheaply(p, rules_for(torch_version)) else p.facts()


@dataclass(frozen=True)
class WeightsOnlyInput:
    """Everything a reader noticed that decides what ``torch.load(path, weights_only=True)`` does."""

    container: str
    pickles: tuple[PickleInput, ...] = ()
    path: str = ""
    parts: tuple[tuple[str, WeightsOnlyInput | None], ...] = ()  # sharded: (shard file, its input)
    note: str = ""  # container OTHER: what reads the input instead of torch.load
    version_record: bytes | None = None  # a zip's format version record (None: the archive has none)


def _version_problem(record: bytes | None) -> str | None:
    """Why torch's zip reader refuses the archive's version record (it reads versions 1 to 10), or None."""
    if record is None:
        return "the archive has no version record, which torch's zip reader requires"
    m = re.match(rb"\s*\+?([0-9]+)", record)
    if m is None:
        return f"the archive's version record {record[:20]!r} is not a number"
    version = int(m.group(1))
    if not 1 <= version <= MAX_ZIP_VERSION:
        return (f"the archive says format version {version}; torch reads versions 1 to {MAX_ZIP_VERSION} "
                "(a newer or corrupt file)")
    return None


# What a reader hands ``read`` per pickle: (bytes, opcodes the guard saw, the unpickler's GlobalRefs, its
# ``where``[, persistent id kinds other than "storage"]).
PickleRecord = (tuple[bytes | None, Iterable[int], Sequence[GlobalRef], str]
                | tuple[bytes | None, Iterable[int], Sequence[GlobalRef], str, Sequence[str]])


def read(container: str, path: str, pickles: Iterable[PickleRecord],
         version_record: bytes | None = None) -> WeightsOnlyInput:
    """A reader's input: per pickle (bytes, opcodes the guard saw, the unpickler's GlobalRefs, its ``where``[,
    persistent id kinds other than "storage"]).

    A reference counts for the pickle whose ``where`` it carries (the globals of
    torch.save bytes nested in it are not the pickle's own).
    """
    out = []
    for data, seen, refs, where, *pids in pickles:
        own = [r for r in refs if r.where == where]
        # a global the reader judged dangerous only after reading (RestrictedUnpickler.restore_stand_ins)
        changed = any(r.severity == DANGEROUS and f"{r.module}.{r.name}" in STANDARD for r in own)
        out.append(pickle_input(data, seen, [(r.module, r.name) for r in own], tuple(pids[0]) if pids else (),
                                changed=changed))
    return WeightsOnlyInput(container, tuple(out), path, version_record=version_record)


def predict_input(inp: WeightsOnlyInput, torch_version: str | None = None) -> WeightsOnlyVerdict:
    """Whether torch.load(path, weights_only=True) of ``torch_version`` (default: installed, else newest) loads it."""
    rules = rules_for(torch_version)
    version = f"{rules.version[0]}.{rules.version[1]}"
    base = WeightsOnlyVerdict(True, (), version, None, rules.default_weights_only)
    c = inp.container
    problem = _version_problem(inp.version_record) if c in (ZIP, TORCHSCRIPT) else None
    if problem is not None:
        return replace(base, loads=False, reason=problem)
    if c in (ZIP, LEGACY, PICKLE):
        return predict([pickle_facts(p, torch_version) for p in inp.pickles], torch_version, container=c)
    if c in (TORCHSCRIPT, TAR):
        return predict([], torch_version, container=c)
    if c == SAFETENSORS:
        if rules.reads_safetensors and inp.path.endswith(".safetensors"):
            return base
        why = ("its name does not end in .safetensors, so torch.load reads it as a pickle and refuses it"
               if rules.reads_safetensors else
               f"torch {version}'s torch.load does not read safetensors files (2.13 hands a *.safetensors path "
               "to safetensors.torch.load_file)")
        return replace(base, loads=False, reason=f"a safetensors file: {why}; load it with "
                       "safetensors.torch.load_file")
    if c == SHARDED:
        return _combine([(name, predict_input(part, torch_version) if part is not None else None)
                         for name, part in inp.parts], base)
    return replace(base, loads=False, applies=False,
                   reason=inp.note or "not a file torch.load reads")


def _combine(parts: list[tuple[str, WeightsOnlyVerdict | None]], base: WeightsOnlyVerdict) -> WeightsOnlyVerdict:
    """A sharded set loads when torch.load loads every shard: needs are the union, the first reason counts."""
    needs: set[str] = set()
    reason = None
    for name, v in parts:
        if v is None:
            reason = reason or f"{name}: not predicted"
            continue
        needs.update(v.needs)
        if v.reason and reason is None:
            reason = f"{name}: {v.reason}"
    return replace(base, loads=not needs and reason is None, needs=tuple(sorted(needs)), reason=reason)


__all__ = [
    "SMALL_PICKLE",
    "STANDARD",
    "PickleInput",
    "WeightsOnlyInput",
    "pickle_facts",
    "pickle_input",
    "predict_input",
    "read",
]
