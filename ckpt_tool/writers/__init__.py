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

from .interface import PayloadMismatch, Shaped, ShapeRequest, Writer, WriteRequest, Written
from .registry import FOLDER_FORMATS, SHARED_FORMATS, TO_CHOICES, TO_VALUES, WRITERS, choose_format, writer

__all__ = ["FOLDER_FORMATS", "SHARED_FORMATS", "TO_CHOICES", "TO_VALUES", "WRITERS", "PayloadMismatch", "ShapeRequest",
           "Shaped", "WriteRequest", "Writer", "Written", "choose_format", "writer"]
