"""What a Hugging Face folder written by migrate holds besides its weights, decided from the source's names.

``from_pretrained`` needs the folder's config (``config.json``,
``adapter_config.json``) and the files beside it that the library's other
loaders read (generation config, tokenizer, processor, chat template,
sentence-transformers modules); it never needs a Trainer's or accelerate's
training state, and the source's own weights files are replaced by the ones
migrate writes. The weights' names are the library's: ``model``,
``adapter_model`` (PEFT loads one file, never a sharded set) or
``diffusion_pytorch_model``. Names and small JSON files only: no weights
file is opened here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import InputError, UsageError
from ...io import paths
from .config import read_json
from .folders import TRAINER_FILES, Layout, identify, is_library_folder

_WEIGHTS = re.compile(r".*\.(safetensors|bin|pt|pth|pkl|ckpt|h5|msgpack|onnx|gguf|index\.json)$")
_STATE = re.compile(r"^(optimizer(_\d+)?\.(bin|pt)|scheduler(_\d+)?\.(bin|pt)|random_states_\d+\.pkl|"
                    r"rng_state(_\d+)?\.pth|scaler\.pt|training_args\.bin|trainer_state\.json)$")


@dataclass(frozen=True, kw_only=True)
class HfOutput:
    """The output folder's plan: the weights' name and place, and the files copied beside them."""

    stem: str  # the weights file is STEM.safetensors, or STEM-0000i-of-0000N.safetensors + STEM.safetensors.index.json
    weights_dir: str = ""  # where the weights go inside the folder ("" its root; a sentence-transformers module)
    library: str | None = None  # None: the source is no library's folder and no --config-from was given
    copy_from: str | None = None  # the folder the files below are copied from
    files: tuple[str, ...] = ()  # relative to copy_from ("/"-separated), each copied byte for byte
    left: tuple[tuple[str, str], ...] = ()  # (file, why it is not copied)
    shardable: bool = True
    hint: str | None = None  # a folder beside the source holding the config --config-from could copy

    @property
    def weights_name(self) -> str:
        return f"{self.stem}.safetensors"

    @property
    def index_name(self) -> str:
        return f"{self.stem}.safetensors.index.json"


def _why_not(name: str) -> str | None:
    if _STATE.match(name) or name in TRAINER_FILES:
        return "training state (optimizer, scheduler, RNG, arguments): not part of a model to load"
    if _WEIGHTS.match(name):
        return "weights: the output's own safetensors replace them"
    if name.startswith("."):
        return "a hidden file"
    return None


def _files(folder: str, sub: str = "") -> tuple[list[str], list[tuple[str, str]]]:
    """The files of ``folder`` to copy and those left, relative to it; sub-folders only when named by caller."""
    keep, left = [], []
    where = paths.join(folder, sub) if sub else folder
    for name in sorted(paths.listdir(where)):
        rel = f"{sub}/{name}" if sub else name
        if not paths.isfile(paths.join(where, name)):
            if paths.isdir(paths.join(where, name)):  # never dropped unsaid (a module's folder is copied by caller)
                left.append((rel + "/", "a folder its library's from_pretrained does not read"))
            continue
        why = _why_not(name)
        if why is None:
            keep.append(rel)
        else:
            left.append((rel, why))
    return keep, left


def _library_of(names: list[str], folder: str) -> tuple[str, str]:
    """(library, weights stem) from a folder's marker files."""
    if "adapter_config.json" in names:
        return "peft", "adapter_model"
    if "modules.json" in names:
        return "sentence-transformers", "model"
    if "config.json" in names and "_class_name" in read_json(paths.join(folder, "config.json")):
        return "diffusers", "diffusion_pytorch_model"
    return "transformers", "model"


def plan_hf_output(src: str, config_from: str | None) -> HfOutput:
    """The output folder of ``migrate SRC --to hf`` (with ``--config-from DIR``: DIR's files instead of SRC's)."""
    if config_from is not None:
        if not paths.isdir(config_from):
            raise UsageError(f"--config-from {config_from}: not a folder (give the folder holding config.json)")
        return _from_folder(config_from, identify_weights=False)
    if paths.isdir(src) and is_library_folder(src):
        return _from_folder(src, identify_weights=True)
    parent = paths.dirname(src)
    hint = parent if parent and paths.isfile(paths.join(parent, "config.json")) else None
    return HfOutput(stem="model", hint=hint)


def _from_folder(path: str, *, identify_weights: bool) -> HfOutput:
    folder, weights_dir = path, ""
    if identify_weights:
        found = identify(path)
        if found.layout == Layout.PIPELINE:
            shown = ", ".join(name for name, _, _ in found.components[:4])
            raise UsageError(f"a diffusers pipeline holds one model per component; migrate writes one model "
                             f"folder: give a component, e.g. {paths.join(path, found.components[0][0])} ({shown})"
                             if found.components else "a diffusers pipeline folder naming no components")
        folder = found.folder  # a run folder: its latest checkpoint-N
        if found.weights and "/" in found.weights:
            weights_dir = found.weights.rsplit("/", 1)[0]
    try:
        names = sorted(paths.listdir(folder))
    except InputError as exc:
        raise UsageError(f"--config-from {path}: {exc.message}") from None
    library, stem = _library_of(names, folder)
    keep, left = _files(folder)
    if library == "sentence-transformers":  # each module's folder is part of the model (modules.json)
        from .config import read_modules

        for module in read_modules(paths.join(folder, "modules.json")):
            mpath = str(module["path"]).strip("/")
            if mpath and paths.isdir(paths.join(folder, mpath)):
                left = [(f, why) for f, why in left if f != f"{mpath}/"]  # copied below, file by file
                more, skipped = _files(folder, mpath)
                if mpath != weights_dir:  # another module's weights (a Dense layer) are its own: copied as they are
                    more += [f for f, why in skipped if why.startswith("weights")]
                    skipped = [(f, why) for f, why in skipped if not why.startswith("weights")]
                keep += more
                left += skipped
    return HfOutput(stem=stem, weights_dir=weights_dir, library=library, copy_from=folder, files=tuple(keep),
                    left=tuple(left), shardable=library != "peft")
