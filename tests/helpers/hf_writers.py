"""Write the folders Hugging Face libraries write, with the real libraries, for tests/formats/test_hf_folders.py.

    python tests/helpers/hf_writers.py OUT_DIR

Run in its own interpreter once per test session (importing transformers,
peft, diffusers and sentence-transformers costs seconds). Tiny random
configs, nothing downloaded. Next to each folder the writer saves the
library's own state_dict as ``NAME.expected.safetensors`` (what inspect of
the folder must equal). Prints one JSON object: layout -> folder, or
``{"skipped": reason}`` where its library is not installed.
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


def _expect(out: str, name: str, state_dict: dict) -> None:  # type: ignore[type-arg]
    """The library's own state_dict as OUT/expected/NAME.safetensors (outside every folder a test reads)."""
    from safetensors.torch import save_file

    os.makedirs(os.path.join(out, "expected"), exist_ok=True)
    save_file({k: v.detach().contiguous().clone() for k, v in state_dict.items()},
              os.path.join(out, "expected", name + ".safetensors"))


def _bert():  # type: ignore[no-untyped-def]
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=32))


def transformers_folders(out: str) -> dict[str, str]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    model = _bert()
    got = {}
    for name, kwargs in (("bert", {}), ("bert_bin", {"safe_serialization": False}),
                         ("bert_sharded", {"max_shard_size": "10KB"})):
        folder = os.path.join(out, name)
        try:
            model.save_pretrained(folder, **kwargs)
        except TypeError:  # transformers 5 writes safetensors only: save the .bin the way 4.x did
            model.save_pretrained(folder)
            os.remove(os.path.join(folder, "model.safetensors"))
            torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
        if name == "bert_bin" and not os.path.exists(os.path.join(folder, "pytorch_model.bin")):
            os.remove(os.path.join(folder, "model.safetensors"))
            torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
        _expect(out, name, model.state_dict())
        got[name] = folder
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    folder = os.path.join(out, "gpt2")
    gpt2.save_pretrained(folder)
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:  # the tie drops lm_head.weight
        saved = set(f.keys())
    _expect(out, "gpt2", {k: v for k, v in gpt2.state_dict().items() if k in saved})
    got["gpt2"] = folder
    return got


def peft_folder(out: str) -> dict[str, str]:
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    model = get_peft_model(_bert(), LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                               init_lora_weights=False))
    folder = os.path.join(out, "peft")
    model.save_pretrained(folder)
    _expect(out, "peft", get_peft_model_state_dict(model))
    return {"peft": folder}


def diffusers_folders(out: str) -> dict[str, str]:
    import torch
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    folder = os.path.join(out, "unet")
    unet.save_pretrained(folder)
    _expect(out, "unet", unet.state_dict())
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10))
    pfolder = os.path.join(out, "pipeline")
    pipe.save_pretrained(pfolder)
    _expect(out, "pipeline", {f"unet.{k}": v for k, v in unet.state_dict().items()})
    return {"unet": folder, "pipeline": pfolder}


def sentence_transformers_folder(out: str) -> dict[str, str]:
    from sentence_transformers import SentenceTransformer, models

    base = os.path.join(out, "st_base")
    _bert().save_pretrained(base)
    from transformers import BertTokenizerFast

    vocab = os.path.join(out, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(59)]) + "\n")
    BertTokenizerFast(vocab_file=vocab).save_pretrained(base)
    word = models.Transformer(base)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())])
    folder = os.path.join(out, "sentence_transformers")
    st.save(folder)
    inner = getattr(word, "auto_model", None) or word.model
    _expect(out, "sentence_transformers", inner.state_dict())
    return {"sentence_transformers": folder}


def trainer_run(out: str) -> dict[str, str]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from third_party_writers import hf_trainer

    checkpoint = hf_trainer(out)
    from safetensors.torch import load_file

    state = load_file(os.path.join(checkpoint, "model.safetensors"))  # the Trainer saved the model it trained
    _expect(out, "trainer_checkpoint", state)
    _expect(out, "trainer_run", state)
    return {"trainer_checkpoint": checkpoint, "trainer_run": os.path.dirname(checkpoint)}


def accelerate_folder(out: str) -> dict[str, str]:
    import torch
    from accelerate import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, sched = acc.prepare(model, opt, sched)
    for _ in range(2):
        acc.backward(model(torch.randn(3, 4)).sum())
        opt.step()
        sched.step()
        opt.zero_grad()
    folder = os.path.join(out, "accelerate")
    acc.save_state(folder)
    _expect(out, "accelerate", acc.unwrap_model(model).state_dict())
    return {"accelerate": folder}


# (module it needs, writer, the layouts it writes)
WRITERS = (("transformers", transformers_folders, ("bert", "bert_bin", "bert_sharded", "gpt2")),
           ("peft", peft_folder, ("peft",)),
           ("diffusers", diffusers_folders, ("unet", "pipeline")),
           ("sentence_transformers", sentence_transformers_folder, ("sentence_transformers",)),
           ("transformers", trainer_run, ("trainer_checkpoint", "trainer_run")),
           ("accelerate", accelerate_folder, ("accelerate",)))


def main(out: str) -> int:
    import importlib.util

    result: dict[str, object] = {}
    for module, writer, layouts in WRITERS:
        if importlib.util.find_spec(module) is None:
            result.update({name: {"skipped": f"{module} is not installed (pip install -r "
                                             "requirements-test.txt)"} for name in layouts})
            continue
        result.update(writer(out))
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
