"""How many bytes each file of a planned output will take, known before a byte is written.

Each writer computes its own (registry.py); here they are asked for.

migrate checks the output file system's free space against these figures
before it reads a tensor byte. They come from the plan alone (tensor sizes,
keys, shapes, the pickled container):

- torch zip: exact (the archive's layout is replayed, padding and ZIP64
  records included);
- safetensors and sharded sets: the tensor bytes exactly; each header and
  the index at most a few bytes per tensor over (an offset is counted with
  as many digits as the largest one);
- DCP: the tensor bytes plus an allowance for torch's records (about
  1.6 KB per tensor in the data file and 200 bytes per tensor plus the key
  in ``.metadata``, as measured with torch 2.13; 2 KiB and 512 bytes are
  counted), since torch's writer cannot be asked in advance.

``quick_bound`` is a looser upper bound that costs next to nothing; the
free-space check asks for the exact figures only when the disk is too full
for the bound (on 200,000 tensors they take 0.1-0.2 s).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..format_names import OutputFormat
from .base import OutTensor
from .interface import WriteRequest
from .payload import Payload
from .registry import writer


def _request(out: str, tensors: Sequence[OutTensor], payload: Payload, shard_bytes: int | None) -> WriteRequest:
    from ..progress import NO_PROGRESS

    return WriteRequest(out=out, tensors=tensors, payload=payload, progress=NO_PROGRESS, shard_bytes=shard_bytes)


def quick_bound(fmt: OutputFormat, out: str, tensors: Sequence[OutTensor], payload: Payload,
                shard_bytes: int | None) -> tuple[int, int] | None:
    """(at least the total bytes, at least the number of files) of the output, from sums alone."""
    return writer(fmt).bound(_request(out, tensors, payload, shard_bytes))


def planned_sizes(fmt: OutputFormat, out: str, tensors: Sequence[OutTensor], payload: Payload,
                  shard_bytes: int | None) -> list[int]:
    """The size of each file the output will hold (one for a file output)."""
    return writer(fmt).sizes(_request(out, tensors, payload, shard_bytes))
