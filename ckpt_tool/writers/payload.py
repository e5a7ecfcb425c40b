"""What a planned output holds besides its tensors, one frozen type per kind of writer.

Planned once by migrate before a byte is written, then read by the size
estimates (sizes.py), the writers and the verification: the pickled
container of a torch output, or the tensors stored once (ties as aliases)
and the string metadata of a safetensors output. A DCP output needs none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import OutTensor

if TYPE_CHECKING:  # the torch writer's modules load only when a torch output is planned
    from .torchsave import StorageTable


@dataclass(frozen=True, kw_only=True)
class TorchPayload:
    """A torch zip output: ``data.pkl``, the storages it names, the tree it was pickled from."""

    data_pkl: bytes
    table: StorageTable
    root: object  # the object pickled, compared with the re-read output
    sd_key: str  # dotted key of the state_dict inside ``root`` ("" when it is the root)


@dataclass(frozen=True, kw_only=True)
class SafetensorsPayload:
    """A safetensors file or sharded set: each tensor stored once, ties as aliases, string metadata."""

    stored: tuple[OutTensor, ...]
    aliases: Mapping[str, str]  # alias -> stored key
    meta: Mapping[str, str]  # ``__metadata__`` entries kept from the source


Payload = TorchPayload | SafetensorsPayload | None
