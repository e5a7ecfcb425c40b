"""Output writers, one module per format; the format comes from OUT's name or ``--to``.

- torchsave/writer.py: ``.pth``/``.pt``/``.bin``/``.ckpt``, what ``torch.save`` writes (standard library only)
- safetensors/writer.py: one ``.safetensors`` file, or a folder of shards plus ``model.safetensors.index.json``
  (standard library only)
- dcp.py: a torch.distributed.checkpoint folder (written by torch)
- hf_folder.py: a Hugging Face folder (weights as safetensors, one file or sharded, with the source folder's
  config and tokenizer files), what ``from_pretrained`` loads

Each implements ``interface.Writer``; ``registry.WRITERS`` lists them, one
line each. The formats are ``format_names.OutputFormat``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports
from .interface import PayloadMismatch, Shaped, ShapeRequest, Writer, WriteRequest, Written
from .registry import FOLDER_FORMATS, SHARED_FORMATS, TO_CHOICES, TO_VALUES, WRITERS, choose_format, writer

if TYPE_CHECKING:
    from .base import CHUNK as CHUNK, OutTensor as OutTensor, require_data as require_data
    from .hf_folder import retyped_config as retyped_config
    from .interface import Reread as Reread
    from .layout import dedupe as dedupe
    from .output import write_all as write_all
    from .payload import Payload as Payload, SafetensorsPayload as SafetensorsPayload, TorchPayload as TorchPayload
    from .shares import (
        Unit as Unit,
        assign as assign,
        safetensors_units as safetensors_units,
        shard_units as shard_units,
        write_unit as write_unit,
    )
    from .sourcebytes import (
        Region as Region,
        coalesced as coalesced,
        file_location as file_location,
        out_bytes as out_bytes,
        small_location as small_location,
        tensor_data as tensor_data,
    )

# What other packages import from this one, each name imported from its module on first use
# (ckpt_tool/lazy.py); tests/test_surfaces.py keeps it the only way in.
EXPORTS: dict[str, tuple[str, ...]] = {
    "base": ("CHUNK", "OutTensor", "require_data"),
    "hf_folder": ("retyped_config",),
    "interface": ("Reread",),
    "layout": ("dedupe",),
    "output": ("write_all",),
    "payload": ("Payload", "SafetensorsPayload", "TorchPayload"),
    "shares": ("Unit", "assign", "safetensors_units", "shard_units", "write_unit"),
    "sourcebytes": ("Region", "coalesced", "file_location", "out_bytes", "small_location", "tensor_data"),
}
__getattr__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "CHUNK",
    "FOLDER_FORMATS",
    "SHARED_FORMATS",
    "TO_CHOICES",
    "TO_VALUES",
    "WRITERS",
    "OutTensor",
    "Payload",
    "PayloadMismatch",
    "Region",
    "Reread",
    "SafetensorsPayload",
    "ShapeRequest",
    "Shaped",
    "TorchPayload",
    "Unit",
    "WriteRequest",
    "Writer",
    "Written",
    "assign",
    "choose_format",
    "coalesced",
    "dedupe",
    "file_location",
    "out_bytes",
    "require_data",
    "retyped_config",
    "safetensors_units",
    "shard_units",
    "sizes",
    "small_location",
    "tensor_data",
    "write_all",
    "write_unit",
    "writer",
]
