"""Load migrate's Hugging Face folder outputs with the libraries' own loaders, for tests/commands/migrate.

    python tests/helpers/hf_loaders.py SPEC.json

SPEC is a list of {"name", "loader", "folder", "expected", "dtype"?}: each
folder is loaded the way its library's users load it (``from_pretrained``,
``PeftModel.from_pretrained`` on a freshly built base, ``SentenceTransformer``),
and the tensors the library ends up holding are compared bit for bit with
``expected`` (the library's own state_dict when the source was written, cast
to ``dtype`` when the migration cast it). One interpreter for every folder:
importing the libraries costs seconds. Prints one JSON object: name -> "ok"
or what differed.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _transformers(folder: str):  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(folder, dtype="auto").state_dict()


def _peft(folder: str):  # type: ignore[no-untyped-def]
    from hf_writers import _bert
    from peft import PeftModel, get_peft_model_state_dict

    return get_peft_model_state_dict(PeftModel.from_pretrained(_bert(), folder))


def _diffusers(folder: str):  # type: ignore[no-untyped-def]
    from diffusers import UNet2DModel

    return UNet2DModel.from_pretrained(folder).state_dict()


def _sentence_transformers(folder: str):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    word = SentenceTransformer(folder, device="cpu")[0]
    inner = getattr(word, "auto_model", None) or word.model
    return inner.state_dict()


LOADERS = {"transformers": _transformers, "peft": _peft, "diffusers": _diffusers,
           "sentence-transformers": _sentence_transformers}


def _compare(got, expected, dtype: str | None) -> str:  # type: ignore[no-untyped-def]
    import torch
    from bits import bits  # tests/helpers/bits.py: this folder is first on sys.path

    problems = []
    for key, saved in expected.items():
        want = saved.to(getattr(torch, dtype)) if dtype is not None and saved.is_floating_point() else saved
        have = got.get(key)
        if have is None:
            problems.append(f"{key} missing")
        elif have.dtype != want.dtype or have.shape != want.shape:
            problems.append(f"{key}: {have.dtype} {tuple(have.shape)} != {want.dtype} {tuple(want.shape)}")
        elif not torch.equal(bits(have), bits(want)):
            problems.append(f"{key}: values differ")
    return "ok" if not problems else "; ".join(problems[:5])


def main(spec_path: str) -> int:
    from safetensors.torch import load_file

    with open(spec_path) as f:
        spec = json.load(f)
    result = {}
    for item in spec:
        got = LOADERS[item["loader"]](item["folder"])
        result[item["name"]] = _compare(got, load_file(item["expected"]), item.get("dtype"))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
