"""What every output format implements: one ``Writer``, registered once in registry.py.

pip-audit's ``interface.py`` way: migrate never asks which format it writes;
it asks the format's writer. A writer says how OUT names it (``--to``
values, extensions), whether it is one file or a folder, whether several
processes can write it (shares.py), how its output is re-read to be
verified, what it holds besides its tensors (``shape``, before a byte is
written), how large its files will be (``sizes``, for the free-space check)
and writes its bytes into the temporary output (``write``). The values
between these steps are frozen; a new output format is one module with one
``Writer`` and one line in registry.py.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from ..format_names import OutputFormat
from .base import OutTensor
from .payload import Payload

if TYPE_CHECKING:
    from ..formats.hf import HfOutput
    from ..io.atomic import AtomicDir, AtomicFile
    from ..keys import RuleSet
    from ..model import Checkpoint
    from ..progress import Progress
    from .safetensors import Follower

# how the verifier re-reads an output: the pickled tree beside its tensors (torch zip), a flat mapping of tensors
# (safetensors, sharded), or a checkpoint its reader builds (DCP)
Reread = Literal["tree", "mapping", "checkpoint"]


@dataclass(frozen=True, kw_only=True)
class ShapeRequest:
    """What shaping an output needs: the source, the state_dict chosen in it, the output tensors, the plan's parts."""

    ck: Checkpoint
    chosen: object  # the container of the state_dict (--key), or the source's root
    tensors: Sequence[OutTensor]
    rules: RuleSet
    source: str  # the source's path, for messages
    state_dict_only: bool = False
    sanitize: bool = False
    hf: HfOutput | None = None


@dataclass(frozen=True, kw_only=True)
class Shaped:
    """The output's container besides its tensors, and what shaping it kept, converted and warned."""

    payload: Payload
    metadata_kept: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    sanitized: tuple[str, ...] | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class WriteRequest:
    """What writing the output's bytes needs, decided before the first one is written."""

    out: str  # the final path (names inside the archive come from it)
    tensors: Sequence[OutTensor]
    payload: Payload
    progress: Progress
    shard_bytes: int | None = None
    hf: HfOutput | None = None
    cast_to: str | None = None  # the one dtype every cast went to (a Hugging Face config then says it)
    follower: Follower | None = None  # reads a safetensors file while it is written (an early verification)


_NOTHING_PROVEN: Mapping[str, tuple[int, int]] = {}


class Written(NamedTuple):
    """What a writer reports besides the bytes: the shard files, warnings about them, and the tensors compared with
    their sources while the file was written (key -> file offset, bytes)."""

    shards: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    proven: Mapping[str, tuple[int, int]] = _NOTHING_PROVEN


class PayloadMismatch(RuntimeError):
    """A writer got the payload of another format: a bug in the planner, never the user's doing."""


class Writer(Protocol):
    """One output format."""

    @property
    def format(self) -> OutputFormat: ...

    @property
    def names(self) -> tuple[str, ...]:
        """The ``--to`` values that choose it (the first is the one messages show)."""

    @property
    def extensions(self) -> tuple[str, ...]:
        """The OUT suffixes that say it (lower case, with the dot); none for a folder."""

    @property
    def folder(self) -> bool:
        """A folder, built in a temporary folder and swapped in whole; else one file."""

    @property
    def shared(self) -> bool:
        """Several processes can write it, each its share (shares.py: ``--workers``, torchrun ranks)."""

    @property
    def suffixes(self) -> tuple[str, ...]:
        """The suffixes of the files a folder of this format holds (what ``--force`` may replace)."""

    @property
    def reread(self) -> Reread: ...

    def shape(self, request: ShapeRequest) -> Shaped:
        """The payload, or refuse (exit 2) what the format cannot hold, before a byte is written."""

    def sizes(self, request: WriteRequest) -> list[int]:
        """The size of each file the output will hold, exact or a few bytes over."""

    def bound(self, request: WriteRequest) -> tuple[int, int] | None:
        """(at least the total bytes, at least the number of files), from sums alone; None: ask ``sizes``."""

    def write(self, into: AtomicFile | AtomicDir, request: WriteRequest) -> Written:
        """Write the output into the open temporary file or folder ``into``."""


def file_fd(into: AtomicFile | AtomicDir) -> int:
    """The open descriptor of a one-file output's temporary file."""
    from ..io.atomic import AtomicFile

    if not isinstance(into, AtomicFile) or into.fd is None:  # AtomicFile opens it on entering: a bug
        raise PayloadMismatch(f"the temporary file for {into.final} is not open")
    return into.fd


def folder_of(into: AtomicFile | AtomicDir) -> AtomicDir:
    """The temporary folder of a folder output."""
    from ..io.atomic import AtomicDir

    if not isinstance(into, AtomicDir):
        raise PayloadMismatch(f"a folder output was given the temporary file {into.path}")
    return into
