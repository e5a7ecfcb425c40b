"""Output writers, one module per format; the format comes from OUT's name or ``--to``.

- torchsave: ``.pth``/``.pt``/``.bin``/``.ckpt``, what ``torch.save`` writes (standard library only)
- safetensors: one ``.safetensors`` file (standard library only)
- sharded: a folder of safetensors shards plus ``model.safetensors.index.json``
- dcp: a torch.distributed.checkpoint folder (written by torch)
- hf_folder: a Hugging Face folder (weights as safetensors, one file or sharded, with the source folder's
  config and tokenizer files), what ``from_pretrained`` loads

The formats are ``format_names.OutputFormat``; commands/migrate/write.py
holds the table from each one to its writer.
"""
from __future__ import annotations

import os

from ..errors import UsageError
from ..format_names import OutputFormat

# --to values -> format
TO_CHOICES = {"pth": OutputFormat.TORCH_ZIP, "pt": OutputFormat.TORCH_ZIP, "torch": OutputFormat.TORCH_ZIP,
              "safetensors": OutputFormat.SAFETENSORS, "dcp": OutputFormat.DCP, "hf": OutputFormat.HF_FOLDER,
              "hf-folder": OutputFormat.HF_FOLDER}
_BY_EXTENSION = {".pth": OutputFormat.TORCH_ZIP, ".pt": OutputFormat.TORCH_ZIP, ".bin": OutputFormat.TORCH_ZIP,
                 ".ckpt": OutputFormat.TORCH_ZIP, ".tar": OutputFormat.TORCH_ZIP,
                 ".safetensors": OutputFormat.SAFETENSORS}
FOLDER_FORMATS = frozenset({OutputFormat.SHARDED, OutputFormat.DCP, OutputFormat.HF_FOLDER})


def choose_format(out: str | None, to: str | None, max_shard_size: int | None) -> OutputFormat:
    """The output format: ``--to`` wins, else OUT's extension; ``--max-shard-size`` means a sharded folder."""
    fmt: OutputFormat | None
    if to is not None:
        fmt = TO_CHOICES.get(to.lower())
        if fmt is None:
            raise UsageError(f"--to {to!r}: expected one of pth, safetensors, dcp, hf")
        named = _BY_EXTENSION.get(os.path.splitext((out or "").rstrip("/"))[1].lower())
        if named is not None and named != fmt:
            raise UsageError(f"--to {to} writes {fmt} but the name {out!r} says {named}: loaders go by the "
                             "extension, so give OUT a matching name")
    elif out is None:
        fmt = OutputFormat.SAFETENSORS if max_shard_size else OutputFormat.TORCH_ZIP
    else:
        ext = os.path.splitext(out.rstrip("/"))[1].lower()
        fmt = _BY_EXTENSION.get(ext)
        if fmt is None:
            if max_shard_size and (ext == "" or out.endswith("/")):
                return OutputFormat.SHARDED
            if ext == "" and os.path.isfile(os.path.join(out, ".metadata")):
                return OutputFormat.DCP
            raise UsageError(f"cannot tell the output format from {out!r}: use a .pth, .pt, .bin or "
                             ".safetensors name, or pass --to pth|safetensors|dcp|hf")
    if fmt is OutputFormat.HF_FOLDER:
        return fmt  # sharded or not, by --max-shard-size
    if max_shard_size:
        if fmt is not OutputFormat.SAFETENSORS:
            raise UsageError("--max-shard-size writes sharded safetensors; it cannot be combined with "
                             f"{'--to ' + to if to else 'a ' + fmt + ' output'}")
        if out is not None and out.lower().endswith(".safetensors"):
            raise UsageError(f"--max-shard-size writes a folder of shards: give OUT as a folder name, "
                             f"e.g. {os.path.splitext(out)[0]}/")
        return OutputFormat.SHARDED
    return fmt
