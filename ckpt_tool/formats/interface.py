"""The readers' interface: what a format provides (Reader), what it takes (ReadOptions), what it returns (Loaded).

pip-audit's ``interface.py`` way: every input format is one package (or
module) implementing ``Reader``, named by one line of registry.py; read_file
(formats/__init__.py) is the only caller, so a new format touches nothing else
but detect.py, which tells it from the bytes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from ..format_names import Format
from ..limits import DEFAULT_LIMITS, Limits
from ..model import DataSource, GlobalRef, TensorMeta

if TYPE_CHECKING:  # the pickle machinery and the weights_only tables load with the readers that use them
    from ..pickles.torch_rules import WeightsOnlyInput
    from ..pickles.unpickle import BlobReader
    from .tp import TpRules


@dataclass(frozen=True)
class Loaded:
    """A reader's result: the container tree plus what the reader noticed.

    Frozen once its reader returns: a step after it (read_file's hints, the
    static walk's findings, unstacking) returns a new one
    (``dataclasses.replace``). ``root`` holds dicts, lists, LazyTensors,
    NumpyArrays, TensorMetas and placeholders, the data the file holds;
    locate.py finds the state_dict inside it.
    """

    format: Format
    root: Any
    references: tuple[GlobalRef, ...] = ()
    warnings: tuple[str, ...] = ()
    sources: tuple[DataSource, ...] = ()
    layout: str | None = None  # set when the format fixes it (torchscript, dcp, safetensors)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # format-level metadata
    framework: str | None = None
    # Set when ``root`` is a flat dict of exactly these TensorMetas, each under
    # its own key and in order (safetensors): locate.py then has nothing to find.
    tensors: tuple[TensorMeta, ...] | None = None
    # What decides torch.load(weights_only=True) of the input
    weights_only: WeightsOnlyInput | None = None
    deferred: bool = False  # values left unread (model.Deferred, DCP bytes items): load(read_values=True) reads them

    def with_warnings_first(self, *warnings: str) -> Loaded:
        """The same result with ``warnings`` said before the reader's own."""
        return replace(self, warnings=(*warnings, *self.warnings)) if warnings else self


@dataclass(frozen=True)
class ReadOptions:
    limits: Limits = DEFAULT_LIMITS
    unsafe: bool = False
    # How torch.save bytes nested in a pickle are read; read_file fills in formats/torchsave/inmemory.py's.
    read_blob: BlobReader | None = None
    # Join the static walk's findings when the file gives reason (checkpoint/findings.py); scan has walked already.
    walk: bool = True
    # How tensor-parallel shards merge when the user gives the rules (migrate --tp-rules FILE)
    tp_rules: TpRules | None = None
    # Read a file that is one part of a larger save (a distributed safetensors rank file) as the bytes it holds,
    # as safetensors itself would: scan asks whether a loader can read the file, not what model it is part of.
    part_as_saved: bool = False
    # How a reader of several files (a sharded set, a library's folder) reads each one; read_file fills in itself.
    read_part: ReadFn | None = None


ReadFn = Callable[[str, ReadOptions], Loaded]


class Reader(Protocol):
    """One input format, as read_file uses it (registry.py names the one for each Format).

    Detection stays in detect.py (one detector, from the bytes); everything
    else read_file needs from a format is here.
    """

    @property
    def format(self) -> Format:
        """The format detect.py returns for the inputs this reader takes."""

    @property
    def unsafe_load(self) -> bool:
        """Whether ``--unsafe`` reads it with torch.load instead (formats/torchsave/unsafe.py)."""

    @property
    def composite(self) -> bool:
        """Whether it reads other inputs through ``options.read_part`` (each joins the walk on its own)."""

    def read(self, path: str, options: ReadOptions) -> Loaded:
        """Read ``path`` whole, without locating the state_dict (checkpoint/locate.py does that)."""

    def weights_only(self, path: str) -> WeightsOnlyInput | None:
        """What torch.load(weights_only=True) meets, when ``read`` recorded nothing (pickles/weights_only/)."""


def part_reader(options: ReadOptions) -> ReadFn:
    """How a composite reader reads each of its files: read_file itself, which every read goes through."""
    if options.read_part is None:
        raise TypeError("a composite reader is called through formats.read_file, which says how parts are read")
    return options.read_part


@dataclass(frozen=True)
class FormatReader:
    """The usual Reader: a read function plus what read_file needs to know of the format."""

    format: Format
    read_fn: ReadFn
    unsafe_load: bool = False
    composite: bool = False
    weights_only_container: str | None = None  # pickles/weights_only/inputs.py: SAFETENSORS, TAR or OTHER
    weights_only_note: str = ""  # container OTHER: what reads the input instead of torch.load

    def read(self, path: str, options: ReadOptions) -> Loaded:
        return self.read_fn(path, options)

    def weights_only(self, path: str) -> WeightsOnlyInput | None:
        if self.weights_only_container is None:
            return None
        from ..pickles.torch_rules import WeightsOnlyInput

        return WeightsOnlyInput(self.weights_only_container, path=path, note=self.weights_only_note)


if TYPE_CHECKING:
    def _implements(reader: FormatReader) -> Reader:  # mypy checks FormatReader against the protocol here
        return reader
