"""Targets built from a library folder's own config, as its from_pretrained builds the model (for --target).

    ckpt diff FOLDER --target tests/helpers/hf_targets.py:transformers_model --target-kwargs '{"folder": "FOLDER"}'

Factories, because these classes are constructed from config objects that
JSON cannot spell (docs/diff.md, "Targets that need objects").
"""
from __future__ import annotations

import os
import warnings

warnings.filterwarnings("ignore")
# No HF_HUB_OFFLINE here: ckpt imports this file into the process that runs it (the test session itself), and
# huggingface_hub, imported after that, would stay offline for the whole process: the hf:// and https://
# tests that ran later in that process (an xdist worker) failed. Nothing below reaches the network: every
# config is read from a local folder.


def transformers_model(folder: str):  # type: ignore[no-untyped-def]
    """The class config.json's ``architectures`` names, built from that config."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    return getattr(transformers, config.architectures[0])(config)


def diffusers_model(folder: str):  # type: ignore[no-untyped-def]
    """The diffusers class config.json's ``_class_name`` names, built from that config."""
    import json

    import diffusers

    with open(os.path.join(folder, "config.json")) as f:
        cls = getattr(diffusers, json.load(f)["_class_name"])
    return cls.from_config(cls.load_config(folder))


def peft_model(folder: str):  # type: ignore[no-untyped-def]
    """A PeftModel as PeftModel.from_pretrained builds it: the base model (tests/helpers/hf_writers.py's) with the
    adapter config of ``folder``."""
    import sys

    from peft import PeftConfig, get_peft_model

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_writers import _bert

    return get_peft_model(_bert(), PeftConfig.from_pretrained(folder))
