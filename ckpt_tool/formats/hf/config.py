"""What the JSON files of a library's folder say: config.json, adapter_config.json, model_index.json, modules.json.

Only the fields that tell a reader what the weights are for are kept
(architectures, model type, dtype, tied embeddings; a PEFT adapter's base
model, type, rank, alpha and target modules; a pipeline's components; a
sentence-transformers model's modules). The files are read as JSON, never
executed, with the header-size limit.
"""
from __future__ import annotations

import json

from ...errors import InputError, LimitExceeded
from ...io import paths
from ...limits import DEFAULT_LIMITS

JsonObject = dict[str, object]

CONFIG_FIELDS = ("architectures", "model_type", "dtype", "torch_dtype", "tie_word_embeddings",
                 "transformers_version", "quantization_config")
ADAPTER_FIELDS = ("base_model_name_or_path", "peft_type", "task_type", "r", "lora_alpha", "target_modules",
                  "modules_to_save")
DIFFUSERS_FIELDS = ("_class_name", "_diffusers_version")


def read_json(path: str, max_bytes: int = DEFAULT_LIMITS.max_header_bytes) -> JsonObject:
    """A JSON object file, size-limited; a file that is not one is an InputError naming it."""
    value = _read_value(path, max_bytes)
    if not isinstance(value, dict):
        raise InputError(f"bad {paths.basename(path)}: not a JSON object", path)
    return {str(k): v for k, v in value.items()}


def _read_value(path: str, max_bytes: int) -> object:
    with paths.open_bytes(path) as data:
        if data.size > max_bytes:
            raise LimitExceeded(f"{paths.basename(path)} is {data.size} bytes, over the limit of {max_bytes} "
                                "(raise it with --max-header-bytes)", path)
        raw = data.read(0, data.size)
    try:
        value: object = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"bad {paths.basename(path)}: {exc}", path) from None
    return value


def pick(obj: JsonObject, fields: tuple[str, ...]) -> JsonObject:
    """The fields of ``obj`` that are present, in ``fields`` order (sets and tuples as lists)."""
    out: JsonObject = {}
    for name in fields:
        if name in obj:
            value = obj[name]
            out[name] = sorted(str(v) for v in value) if isinstance(value, (set, tuple)) else value
    return out


def model_config(obj: JsonObject) -> JsonObject:
    """config.json of a transformers or diffusers model: what it is and in which dtype it was saved."""
    return pick(obj, DIFFUSERS_FIELDS + CONFIG_FIELDS)


def adapter_config(obj: JsonObject) -> JsonObject:
    return pick(obj, ADAPTER_FIELDS)


def pipeline_components(obj: JsonObject) -> dict[str, tuple[str, str]]:
    """model_index.json: component folder -> (library, class); entries without a class (None) are skipped."""
    out: dict[str, tuple[str, str]] = {}
    for name, value in obj.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls = value
        if isinstance(library, str) and isinstance(cls, str):
            out[name] = (library, cls)
    return out


def st_modules(value: object, where: str) -> list[JsonObject]:
    """modules.json of sentence-transformers: a list of {idx, name, path, type}."""
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise InputError("bad modules.json: not a list of module objects", where)
    out: list[JsonObject] = []
    for m in value:
        path = m.get("path", "")
        out.append({"name": str(m.get("name", "")), "path": path if isinstance(path, str) else "",
                    "type": str(m.get("type", ""))})
    return out


def read_modules(path: str, max_bytes: int = DEFAULT_LIMITS.max_header_bytes) -> list[JsonObject]:
    return st_modules(_read_value(path, max_bytes), path)
