"""Which library wrote a folder, and which of its files hold the model.

The weights are chosen as the library's own loader chooses them
(transformers' ``_get_resolved_checkpoint_files``: ``model.safetensors``,
then ``model.safetensors.index.json``, then ``pytorch_model.bin``, then its
index; PEFT and diffusers the same with their own names). A folder whose
weights cannot be decided (none of those names, or two models side by
side) is an error naming its files, never a guess. Decided from file names
and the small JSON files only: no weights file is opened here.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ...errors import InputError
from ...format_names import Name
from ...io import paths
from .config import JsonObject, adapter_config, model_config, pipeline_components, read_json, read_modules


class Library(Name):
    """Who wrote the folder (the report's ``hf_folder.library``)."""

    TRANSFORMERS = "transformers"
    PEFT = "peft"
    DIFFUSERS = "diffusers"
    SENTENCE_TRANSFORMERS = "sentence-transformers"
    ACCELERATE = "accelerate"


class Layout(Name):
    """What kind of folder it is (the report's ``hf_folder.layout``)."""

    SAVE_PRETRAINED = "save_pretrained"
    ADAPTER = "adapter"
    PIPELINE = "pipeline"
    MODULES = "modules"
    TRAINER_CHECKPOINT = "trainer checkpoint"
    SAVE_STATE = "save_state"
    RUN = "run"


TRANSFORMERS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                        "pytorch_model.bin.index.json")
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json",
                     "diffusion_pytorch_model.bin", "diffusion_pytorch_model.bin.index.json")
ACCELERATE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
TRAINER_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "training_args.bin", "rng_state.pth")
_ACCELERATE_STATE = re.compile(r"^(optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|random_states_\d+\.pkl)$")
_ACCELERATE_MODEL = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin)$")
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils._re_checkpoint
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".ckpt", ".h5", ".msgpack", ".index.json")
_MARKERS = ("config.json", "adapter_config.json", "model_index.json", "modules.json", "scheduler_config.json")


@dataclass(frozen=True, kw_only=True)
class Folder:
    """A library's folder: what wrote it, the weights to read (relative to ``folder``) and what else it holds."""

    path: str
    library: Library
    layout: Layout
    folder: str  # where ``weights`` and ``files`` lie (a run's latest checkpoint-N, or ``path``)
    weights: str | None  # None: a pipeline (its components hold the weights)
    config: JsonObject = field(default_factory=dict)
    files: tuple[str, ...] = ()  # every other file, relative to ``folder``
    not_read: tuple[tuple[str, str], ...] = ()  # (file, why the loader passes it over)
    components: tuple[tuple[str, str, str], ...] = ()  # pipeline (folder, library, class)
    modules: tuple[JsonObject, ...] = ()  # sentence-transformers modules.json entries
    run: JsonObject = field(default_factory=dict)  # a run folder: latest, others, trainer_state's best

    def metadata(self) -> JsonObject:
        """The ``hf_folder`` entry of the report's metadata (JSON-safe)."""
        out: JsonObject = {"library": str(self.library), "layout": str(self.layout), "weights": self.weights,
                           "config": dict(self.config), "files": list(self.files)}
        if self.not_read:
            out["not_read"] = dict(self.not_read)
        if self.components:
            out["components"] = {name: {"library": lib, "class": cls} for name, lib, cls in self.components}
        if self.modules:
            out["modules"] = [dict(m) for m in self.modules]
        if self.run:
            out["run"] = dict(self.run)
        return out


def check_inside(folder: str, name: str, named_by: str) -> None:
    """Fail closed on a folder name a JSON file gives that leads outside ``folder`` ('..', absolute, a link out)."""
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise InputError(f"{named_by} names {name!r}, which points outside the folder", folder)
    if paths.is_url(folder) or not os.path.lexists(os.path.join(folder, *parts)):
        return
    root = os.path.realpath(folder)
    if os.path.commonpath([root, os.path.realpath(os.path.join(folder, *parts))]) != root:
        raise InputError(f"{named_by} names {name!r}, which leads outside the folder through a symbolic link",
                         folder)


def _names(folder: str) -> list[str]:
    try:
        return sorted(paths.listdir(folder))
    except InputError:
        return []


def is_library_folder(folder: str) -> bool:
    """Whether ``folder`` looks written by a library ckpt reads (names only: cheap enough for detect)."""
    names = _names(folder)
    if any(m in names for m in _MARKERS):
        return True
    if any(_ACCELERATE_MODEL.match(n) for n in names) and any(_ACCELERATE_STATE.match(n) for n in names):
        return True
    return bool(_checkpoints(folder, names))


def _checkpoints(folder: str, names: list[str]) -> list[tuple[int, str]]:
    found = [(int(m.group(1)), n) for n in names if (m := _CHECKPOINT_DIR.match(n))]
    return sorted((step, n) for step, n in found if paths.isdir(paths.join(folder, n)))


def choose(folder: str, names: list[str], order: tuple[str, ...], what: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The first of ``order`` present (the loader's own choice) and the candidates it passes over."""
    present = [n for n in order if n in names]
    if not present:
        weights = [n for n in names if n.endswith(_WEIGHT_SUFFIXES)]
        held = f"; it holds {', '.join(weights)}, none of which its loader reads by default" if weights else (
            "; it holds no weights file")
        raise InputError(f"{what} without its weights: no {', '.join(order[:-1])} or {order[-1]}{held} "
                         "(give the weights file itself to read it)", folder)
    chosen = present[0]
    skipped = tuple((n, f"{what.split(' ')[1]} loads {chosen} first") for n in present[1:]
                    if not (n.endswith(".index.json") and chosen.endswith(".index.json")))
    return chosen, skipped


def identify(path: str) -> Folder:
    """What wrote ``path`` and which file holds its model; InputError when a library folder cannot be decided."""
    names = _names(path)
    if "model_index.json" in names:
        return _pipeline(path, names)
    if "adapter_config.json" in names:
        chosen, skipped = choose(path, names, PEFT_WEIGHTS, "a peft adapter folder (adapter_config.json)")
        config = adapter_config(read_json(paths.join(path, "adapter_config.json")))
        return _folder(path, names, Library.PEFT, Layout.ADAPTER, chosen, config, skipped)
    if "modules.json" in names:
        return _sentence_transformers(path, names)
    if "config.json" in names:
        config = read_json(paths.join(path, "config.json"))
        if "_class_name" in config:
            chosen, skipped = choose(path, names, DIFFUSERS_WEIGHTS, "a diffusers model folder (config.json)")
            return _folder(path, names, Library.DIFFUSERS, Layout.SAVE_PRETRAINED, chosen,
                           model_config(config), skipped)
        trainer = any(n in names for n in TRAINER_FILES)
        what = "a transformers Trainer checkpoint" if trainer else "a transformers save_pretrained folder"
        chosen, skipped = choose(path, names, TRANSFORMERS_WEIGHTS, what + " (config.json)")
        return _folder(path, names, Library.TRANSFORMERS, Layout.TRAINER_CHECKPOINT if trainer
                       else Layout.SAVE_PRETRAINED, chosen, model_config(config), skipped)
    models = [n for n in names if _ACCELERATE_MODEL.match(n)]
    if models and any(_ACCELERATE_STATE.match(n) for n in names):
        if len(models) > 1 and not (len(models) == 2 and set(models) == set(ACCELERATE_WEIGHTS)):
            raise InputError(f"an accelerate save_state folder holding {len(models)} models "
                             f"({', '.join(models)}): give the one to read", path)
        chosen, skipped = choose(path, names, ACCELERATE_WEIGHTS, "an accelerate save_state folder")
        return _folder(path, names, Library.ACCELERATE, Layout.SAVE_STATE, chosen, {}, skipped)
    checkpoints = _checkpoints(path, names)
    if checkpoints:
        return _run(path, checkpoints)
    if "scheduler_config.json" in names:
        raise InputError("a diffusers scheduler folder (scheduler_config.json): it holds no weights", path)
    raise InputError("not a folder a library ckpt reads wrote (no config.json, adapter_config.json, "
                     "model_index.json, modules.json, accelerate state or checkpoint-N/)", path)


def _folder(path: str, names: list[str], library: Library, layout: Layout, chosen: str, config: JsonObject,
            skipped: tuple[tuple[str, str], ...]) -> Folder:
    files = tuple(n for n in names if n != chosen and paths.isfile(paths.join(path, n)))
    return Folder(path=path, library=library, layout=layout, folder=path, weights=chosen, config=config,
                  files=files, not_read=skipped)


def _pipeline(path: str, names: list[str]) -> Folder:
    index = read_json(paths.join(path, "model_index.json"))
    components = tuple((name, lib, cls) for name, (lib, cls) in sorted(pipeline_components(index).items()))
    for name, _, _ in components:
        check_inside(path, name, "model_index.json")
    missing = [name for name, _, _ in components if name not in names]
    if missing:
        raise InputError(f"a diffusers pipeline folder whose model_index.json names components that are not "
                         f"here: {', '.join(missing)}", path)
    files = tuple(n for n in names if paths.isfile(paths.join(path, n)))
    config = {k: v for k, v in index.items() if k in ("_class_name", "_diffusers_version")}
    return Folder(path=path, library=Library.DIFFUSERS, layout=Layout.PIPELINE, folder=path, weights=None,
                  config=config, files=files, components=components)


def has_weights(path: str) -> bool:
    """Whether a pipeline component folder holds a model (a scheduler or tokenizer folder does not)."""
    names = _names(path)
    return "config.json" in names and any(n in names for n in TRANSFORMERS_WEIGHTS + DIFFUSERS_WEIGHTS)


def _sentence_transformers(path: str, names: list[str]) -> Folder:
    modules = read_modules(paths.join(path, "modules.json"))
    holders = [m for m in modules if str(m["type"]).endswith(".Transformer")]
    if len(holders) != 1:
        raise InputError(f"a sentence-transformers folder with {len(holders)} Transformer modules in modules.json "
                         "(ckpt reads the one that holds the model's weights): give its folder", path)
    for m in modules:
        check_inside(path, str(m["path"]) or ".", "modules.json")
    sub = str(holders[0]["path"]).strip("/")
    where = paths.join(path, sub) if sub else path
    inner = _names(where) if sub else names
    chosen, skipped = choose(where, inner, TRANSFORMERS_WEIGHTS,
                             "a sentence-transformers Transformer module (config.json)")
    config = model_config(read_json(paths.join(where, "config.json"))) if "config.json" in inner else {}
    for m in modules:
        mpath = str(m["path"]).strip("/")
        mnames = _names(paths.join(path, mpath)) if mpath else names
        own = [n for n in mnames if n.endswith((".safetensors", ".bin", ".pt", ".pth"))]
        m["weights"] = chosen if m is holders[0] else (own[0] if own else None)
    weights = f"{sub}/{chosen}" if sub else chosen
    files = tuple(n for n in names if n != weights and paths.isfile(paths.join(path, n)))
    return Folder(path=path, library=Library.SENTENCE_TRANSFORMERS, layout=Layout.MODULES, folder=path,
                  weights=weights, config=config, files=files, not_read=skipped, modules=tuple(modules))


def _run(path: str, checkpoints: list[tuple[int, str]]) -> Folder:
    """A Trainer output folder: its latest checkpoint-N is the checkpoint (transformers' get_last_checkpoint)."""
    latest = checkpoints[-1][1]
    inner = identify(paths.join(path, latest))
    run: JsonObject = {"latest": latest, "others": [n for _, n in checkpoints[:-1]]}
    state_path = paths.join(paths.join(path, latest), "trainer_state.json")
    if paths.isfile(state_path):
        state = read_json(state_path)
        best = state.get("best_model_checkpoint")
        if isinstance(best, str):
            run["best_model_checkpoint"] = best
    return Folder(path=path, library=inner.library, layout=Layout.RUN, folder=inner.folder, weights=inner.weights,
                  config=inner.config, files=inner.files, not_read=inner.not_read, run=run)
