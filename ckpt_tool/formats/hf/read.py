"""Read a library's folder as the model it holds (folders.py decides which file that is).

The weights file (or sharded set) is read by its own reader, so a
save_pretrained folder reports the format of its weights (``safetensors``,
``torch-zip``, ``sharded``); what the folder adds is the ``hf_folder``
metadata entry: the library, the layout, what config.json says, and the
folder's other files (the Trainer's optimizer, scheduler and RNG states),
whose weights_only verdicts inspect lists. A diffusers pipeline has no one
model: its components' weights are read each in turn and reported under
``COMPONENT.`` prefixes, as the pipeline's single-file checkpoints key them.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable

from ...errors import InputError
from ...format_names import Format
from ...io import paths
from ...model import DataSource, GlobalRef, TensorMeta
from ..checkpoint import file_danger, located_tensors
from ..interface import FormatReader, Loaded, ReadOptions, part_reader
from .folders import Folder, Layout, has_weights, identify
from .opened import opened

ReadFile = Callable[[str, ReadOptions], Loaded]
Locate = Callable[[Loaded, str], list[TensorMeta]]


def read_folder(path: str, options: ReadOptions, read_file: ReadFile, locate: Locate) -> Loaded:
    """The model of a library's folder, with the folder's ``hf_folder`` metadata."""
    found = identify(path)
    if found.layout == Layout.PIPELINE:
        return _read_pipeline(found, options, read_file, locate)
    if found.weights is None:  # identify names the weights of every layout but a pipeline
        raise InputError(f"a {found.library} {found.layout} folder naming no weights file", path)
    loaded = _judge_state_files(read_file(paths.join(found.folder, found.weights), options), found, options,
                                read_file)
    warnings = (*loaded.warnings, *(f"{name} is not read: {why}" for name, why in found.not_read))
    if found.run:
        others = found.run.get("others")
        also = ", ".join(str(o) for o in others) if isinstance(others, list) else ""
        warnings = (f"a Trainer run folder: reading its latest checkpoint, {found.run['latest']}"
                    + (f" (also here: {also})" if also else ""), *warnings)
    return dataclasses.replace(loaded, metadata={**loaded.metadata, "hf_folder": found.metadata()}, warnings=warnings)


def _judge_state_files(loaded: Loaded, found: Folder, options: ReadOptions, read_file: ReadFile) -> Loaded:
    """Walk the pickle of every state file the library's resume code opens (opened.py): inspect judges what
    scan and gate judge. One that cannot be read is an error, as it is for the loader."""
    references, warnings = list(loaded.references), list(loaded.warnings)
    for f in opened(found):
        part = read_file(paths.join(found.folder, f.name), options)
        try:
            references += part.references
            warnings += file_danger(f.name, part.references, f.how)
            warnings += [f"{f.name}: {w}" for w in part.warnings]
        finally:
            for source in part.sources:
                source.close()
    return dataclasses.replace(loaded, references=tuple(references), warnings=tuple(warnings))


def _read_pipeline(found: Folder, options: ReadOptions, read_file: ReadFile, locate: Locate) -> Loaded:
    merged: OrderedDict[str, TensorMeta] = OrderedDict()
    meta = found.metadata()
    components: dict[str, dict[str, object]] = {}
    formats: set[Format] = set()
    references: list[GlobalRef] = []
    warnings: list[str] = []
    sources: list[DataSource] = []
    for name, lib, cls in found.components:
        sub = paths.join(found.path, name)
        entry: dict[str, object] = {"library": lib, "class": cls, "weights": None, "tensors": 0}
        components[name] = entry
        if not paths.isdir(sub) or not has_weights(sub):
            continue
        part = read_file(sub, options)
        tensors = locate(part, sub)
        inner = part.metadata.get("hf_folder")
        entry["weights"] = inner.get("weights") if isinstance(inner, dict) else None
        entry["format"] = part.format
        entry["tensors"] = len(tensors)
        formats.add(part.format)
        references.extend(part.references)
        warnings.extend(f"{name}: {w}" for w in part.warnings)
        sources.extend(part.sources)
        for t in tensors:
            merged[f"{name}.{t.key}"] = dataclasses.replace(t, key=f"{name}.{t.key}")
    if not merged:
        raise InputError("a diffusers pipeline folder none of whose components holds weights "
                         f"({', '.join(components) or 'model_index.json names none'})", found.path)
    meta["components"] = components
    # one format when every component has it; a pipeline of mixed files is reported as the folder it is
    fmt = next(iter(formats)) if len(formats) == 1 else Format.HF_FOLDER
    return Loaded(fmt, merged, tuple(references), tuple(warnings), tuple(sources), layout="state_dict",
                  metadata={"hf_folder": meta}, tensors=tuple(merged.values()))


def read_library_folder(path: str, options: ReadOptions) -> Loaded:
    """``read_folder`` as the registry calls it: each file read through read_file."""
    return read_folder(path, options, part_reader(options), located_tensors)


READER = FormatReader(Format.HF_FOLDER, read_library_folder, composite=True)
