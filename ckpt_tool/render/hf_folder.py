"""The summary lines of a library's folder in ``ckpt inspect`` (the ``hf_folder`` metadata entry)."""
from __future__ import annotations

import json
from collections.abc import Mapping


def _config_text(config: Mapping[str, object]) -> str:
    parts = []
    arch = config.get("architectures") or config.get("_class_name")
    if isinstance(arch, list):
        arch = ", ".join(map(str, arch))
    if arch:
        parts.append(str(arch))
    for name in ("model_type", "peft_type", "base_model_name_or_path"):
        if config.get(name):
            parts.append(f"{name} {config[name]}")
    dtype = config.get("dtype") or config.get("torch_dtype")
    if dtype:
        parts.append(f"saved as {dtype}")
    if config.get("tie_word_embeddings") is not None:
        parts.append(f"tie_word_embeddings {json.dumps(config['tie_word_embeddings'])}")
    if config.get("r") is not None:
        parts.append(f"r {config['r']}, lora_alpha {config.get('lora_alpha')}")
    if config.get("target_modules"):
        targets = config["target_modules"]
        parts.append("target_modules " + (", ".join(map(str, targets)) if isinstance(targets, list) else str(targets)))
    return "; ".join(parts)


def folder_lines(metadata: Mapping[str, object]) -> list[str]:
    """What wrote the folder, what its config says, which file is the model and what else it holds."""
    meta = metadata.get("hf_folder")
    if not isinstance(meta, Mapping):
        return []
    config = meta.get("config")
    described = _config_text(config) if isinstance(config, Mapping) else ""
    lines = [f"library:    {meta.get('library')} {meta.get('layout')}" + (f" ({described})" if described else "")]
    run = meta.get("run")
    if isinstance(run, Mapping):
        others = run.get("others") or []
        lines.append(f"checkpoint: {run.get('latest')} (the latest)"
                     + (f"; also here: {', '.join(map(str, others))}" if others else "")
                     + (f"; trainer_state's best: {run['best_model_checkpoint']}"
                        if run.get("best_model_checkpoint") else ""))
    if meta.get("weights"):
        lines.append(f"weights:    {meta['weights']}")
    components = meta.get("components")
    if isinstance(components, Mapping):
        for name, c in components.items():
            if isinstance(c, Mapping):
                held = (f"{c.get('weights')}, {c.get('tensors')} tensors under '{name}.'" if c.get("weights")
                        else "no weights")
                lines.append(f"component:  {name} ({c.get('library')} {c.get('class')}): {held}")
    modules = meta.get("modules")
    if isinstance(modules, list):
        for m in modules:
            if isinstance(m, Mapping):
                where = m.get("path") or "."
                held = f"weights {m['weights']}" if m.get("weights") else "no weights"
                lines.append(f"module:     {m.get('name')} {m.get('type')} in {where}: {held}")
    files = meta.get("files")
    if isinstance(files, list) and files:
        lines.append("also here:  " + ", ".join(map(str, files)))
    return lines


__all__ = ["folder_lines"]
