"""What every format reader returns, before the state_dict is located."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..format_names import Format
from ..limits import DEFAULT_LIMITS, Limits
from ..model import DataSource, GlobalRef, TensorMeta
from ..pickles.torch_rules.inputs import WeightsOnlyInput
from ..pickles.unpickle.unpickler import BlobReader

if TYPE_CHECKING:
    from .tp import TpRules


@dataclass
class Loaded:
    """A reader's result: the container tree plus what the reader noticed.

    ``root`` holds dicts, lists, LazyTensors, NumpyArrays, TensorMetas and
    placeholders; locate.py finds the state_dict inside it.
    """

    format: Format
    root: Any
    references: list[GlobalRef] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: list[DataSource] = field(default_factory=list)
    layout: str | None = None  # set when the format fixes it (torchscript, dcp, safetensors)
    metadata: dict[str, Any] = field(default_factory=dict)  # format-level metadata
    framework: str | None = None
    # Set when ``root`` is a flat dict of exactly these TensorMetas, each under
    # its own key and in order (safetensors): locate.py then has nothing to find.
    tensors: list[TensorMeta] | None = None
    # What decides torch.load(weights_only=True) of the input
    weights_only: WeightsOnlyInput | None = None
    deferred: bool = False  # values left unread (model.Deferred, DCP bytes items): load(read_values=True) reads them


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
