"""Standard-library classes a pickle may construct without side effects (reviewed against CPython 3.11).

The values ckpt already accepted (datetime, decimal, fractions, uuid, pathlib, argparse.Namespace,
``re._compile``, ...) are in pickles/inert.py's REVIEWED table; these are the further classes
tools/catalog_candidates.py enumerates from the standard library.
"""
from __future__ import annotations

from .entry import Entry

_PY = "CPython 3.11"
_ENUM = "an Enum: unpickling calls the class with a value, which only looks an existing member up (Enum.__new__)"

ENTRIES: tuple[Entry, ...] = (
    Entry("re", "RegexFlag", "inert", _ENUM + " (re.I, re.M ... held beside a pattern)", _PY),
    Entry("uuid", "SafeUUID", "inert", _ENUM, _PY),
    Entry("decimal", "DecimalTuple", "inert", "a namedtuple (sign, digits, exponent): the generated __new__ only "
          "builds the tuple", _PY),
    *(Entry("pathlib", n, "inert", "the path class itself (omegaconf's PathNode keeps it as its type); calling it "
            "builds a path value like PosixPath (in inert.REVIEWED): the file system is never touched", _PY)
      for n in ("Path", "PurePath")),
    # typing's special forms: omegaconf containers keep their annotations (ref_type, key_type: typing.Any,
    # Dict, List) and pickle them by name. Referenced, they are constants; called, they raise TypeError.
    *(Entry("typing", n, "inert", "a typing special form, pickled by name (omegaconf's ref_type/key_type); "
            "calling it raises TypeError, subscripting it is a separate operator.getitem call", _PY)
      for n in ("Any", "Dict", "List", "Tuple", "Optional", "Union")),
    # The Enum base classes themselves: called with one value they raise (no members); with more arguments they
    # are the functional API, which builds a new class at load. No saved checkpoint names them; left out.
    *(Entry("enum", n, "excluded", "an Enum base class: called with several arguments it is the functional API "
            "(builds a class at load); a pickled member names its own class, never this", _PY)
      for n in ("Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "ReprEnum", "EnumCheck", "FlagBoundary")),
)
