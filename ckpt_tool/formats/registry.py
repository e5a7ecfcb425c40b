"""Every input format's reader, one line each: ``Format -> "module:attribute"`` under formats/.

A reader module is imported on first use, so a command imports only the
reader its input needs (``ckpt inspect x.safetensors`` never imports the
torch-zip, DCP or DeepSpeed readers) and none of them imports torch.
detect.py never returns TORCHSCRIPT or DILL (the zip and pickle readers
tell them), nor IN_MEMORY (no file: commands/inputs.py).
"""
from __future__ import annotations

import importlib

from ..errors import UnsupportedFormat
from ..format_names import Format
from .interface import Reader

READERS: dict[Format, str] = {
    Format.TORCH_ZIP: "torchsave.archive:READER",
    Format.SAFETENSORS: "safetensors.header:READER",
    Format.TORCH_LEGACY: "torchsave.legacy:READER",
    Format.PICKLE: "torchsave.plainpickle:READER",
    Format.DCP: "dcp.metadata:READER",
    Format.TORCH_TAR: "torchsave.tar:READER",
    Format.SHARDED: "hf.index:READER",
    Format.HF_FOLDER: "hf.read:READER",
    Format.DEEPSPEED: "deepspeed.read:READER",
    Format.MEGATRON_LEGACY: "megatron.legacy_folder:READER",
    Format.TORCH_EXPORT: "torchsave.export:READER",
    Format.DIST_SAFETENSORS: "safetensors.rank_slices:READER",
    Format.RANKS: "ranks.read:READER",
    Format.NUMPY: "numpy.read:NPY_READER",
    Format.NPZ: "numpy.read:NPZ_READER",
}


def reader_for(fmt: Format) -> Reader:
    """The reader of ``fmt``, its module imported now (the first time)."""
    entry = READERS.get(fmt)
    if entry is None:
        raise UnsupportedFormat(f"no reader for the format {fmt}")
    module_name, attribute = entry.split(":")
    module = importlib.import_module(f"{__package__}.{module_name}")
    reader: Reader = getattr(module, attribute)
    return reader
