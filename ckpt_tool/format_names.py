"""The names of the formats ckpt reads and writes, declared once for every layer.

They are ``str`` Enums so that JSON, messages and old comparisons with the
plain strings (``report.format == "torch-zip"``) keep working unchanged.
"""
from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    """A closed set of names whose ``str()`` is the name itself (``enum.StrEnum`` is Python 3.11+).

    Every closed vocabulary of the package (formats, severities, check names, ...) derives from it.
    """

    def __str__(self) -> str:
        return str(self.value)


class Format(Name):
    """What a file or folder is, as detect.py tells it from its bytes (never from its name)."""

    TORCH_ZIP = "torch-zip"
    TORCHSCRIPT = "torchscript"
    TORCH_LEGACY = "torch-legacy"
    TORCH_TAR = "torch-tar"  # torch 0.1.x tar-based checkpoints
    PICKLE = "pickle"
    DILL = "dill"  # a pickle that uses dill's by-value globals (read like PICKLE)
    SAFETENSORS = "safetensors"
    SHARDED = "sharded"  # a ``*.index.json`` weight map over safetensors or .bin shards
    DCP = "dcp"
    DEEPSPEED = "deepspeed"  # a DeepSpeed run folder (``latest``) or tag folder, read as the consolidated model
    TORCH_EXPORT = "torch-export"  # a torch.export.save ``.pt2`` archive (formats/torchsave/export.py)
    # A folder a library wrote (save_pretrained, PEFT, diffusers, sentence-transformers, Trainer, accelerate):
    # what detect says of it; the report's format is that of the weights it holds (formats/hf/read.py).
    HF_FOLDER = "hf-folder"
    # A folder of per-rank torch.save files of DTensor/ShardedTensor state dicts (verl's model_world_size_N_rank_K.pt,
    # an FSDP2 state_dict() or FSDP1 SHARDED_STATE_DICT saved by each rank), read as the consolidated model
    RANKS = "ranks"


class OutputFormat(Name):
    """What ``ckpt migrate`` can write; each has one writer (writers/)."""

    TORCH_ZIP = "torch-zip"
    SAFETENSORS = "safetensors"
    SHARDED = "sharded"
    DCP = "dcp"
