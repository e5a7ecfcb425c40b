"""Third-party classes in the catalog (ckpt_tool/pickles/catalog/third_party.py), checked with the libraries.

Files are written by the libraries' own code (transformers' Trainer.save_model writes training_args.bin,
Lightning's Trainer writes the .ckpt with save_hyperparameters, an OmegaConf config inside it), so the
globals are the ones real checkpoints hold; every inert entry also gets a sample. Each is unpickled for real
in an audited child and must show no side effect, and ckpt must call the file safe. Without a library, its
tests skip saying which.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ckpt_tool import scan
from ckpt_tool.pickles.catalog import third_party
from tests.catalog_samples import audited_load, sample

LIBS = ("transformers", "accelerate", "omegaconf", "lightning_fabric", "pytorch_lightning", "mmengine", "torchao")
MISSING = [name for name in LIBS if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the test-only libraries {MISSING} "
                                                      "(requirements-test.txt)")

INERT = sorted((e for e in third_party.ENTRIES if e.decision == "inert"), key=lambda e: e.pair)
ROOT = Path(__file__).resolve().parents[2]

# What the libraries write: one child process (importing transformers and Lightning costs seconds).
WRITE = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    os.environ["WANDB_DISABLED"] = "true"
    out = sys.argv[1]
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
    model = BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                                     intermediate_size=8, vocab_size=16))
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), report_to="none", use_cpu=True)
    Trainer(model=model, args=args).save_model(os.path.join(out, "trainer"))

    import pytorch_lightning as pl
    from omegaconf import OmegaConf

    class Tiny(pl.LightningModule):
        def __init__(self, cfg, lr=0.1):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(2, 1)
        def training_step(self, batch, _):
            return self.layer(batch[0]).sum()
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    cfg = OmegaConf.create({"model": {"width": 2, "layers": [1, 2, {"act": "relu"}], "tag": "${model.width}"},
                            "seed": 3, "ratio": 0.5, "on": True, "nothing": None})
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=out)
    trainer.fit(Tiny(cfg), data)
    trainer.save_checkpoint(os.path.join(out, "lightning.ckpt"))
    """
)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("libraries")
    proc = subprocess.run([sys.executable, "-c", WRITE, str(out)], capture_output=True, text=True, timeout=300,
                          check=False, cwd=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _globals(path: Path) -> dict[str, str]:
    (f,) = scan([str(path)]).files
    return {g.qualname: g.severity.value for g in f.globals}


def test_trainer_training_args_bin_is_safe_and_every_class_in_it_is_catalogued(written):
    path = written / "trainer" / "training_args.bin"
    judged = _globals(path)
    assert "transformers.training_args.TrainingArguments" in judged and "accelerate.state.PartialState" in judged
    assert {q for q, s in judged.items() if s != "safe"} == set(), judged
    (f,) = scan([str(path)]).files
    assert f.verdict == "safe"
    assert audited_load({"transformers.training_args_bin": path}, preload=("transformers.training_args",)) == {
        "transformers.training_args_bin": "loaded"}


def test_lightning_ckpt_with_omegaconf_hyper_parameters_is_safe(written):
    path = written / "lightning.ckpt"
    judged = _globals(path)
    assert "omegaconf.dictconfig.DictConfig" in judged and "omegaconf.listconfig.ListConfig" in judged
    assert {q for q, s in judged.items() if s != "safe"} == set(), judged
    result = audited_load({"pytorch_lightning.ckpt": path},
                          preload=("pytorch_lightning", "omegaconf", "lightning_fabric"))
    assert result == {"pytorch_lightning.ckpt": "loaded"}


def test_gate_passes_loads_safely_on_the_trainer_folder_and_weights_only_fails(written, run_cli):
    """loads-safely and weights-only stay separate questions: torch's restricted loader refuses these classes."""
    r = run_cli("gate", "--json", str(written / "trainer" / "training_args.bin"))
    assert "loads-safely" in r.out
    import json

    checks = {c["name"]: c for c in json.loads(r.out)["files"][0]["checks"]}
    assert checks["loads-safely"]["passed"], checks["loads-safely"]
    assert not checks["weights-only"]["passed"], checks["weights-only"]


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    folder = tmp_path_factory.mktemp("third_party")
    paths: dict[str, Path] = {}
    for e in INERT:
        obj = sample(e)
        if obj is None:
            continue
        label = f"{e.module}.{e.name}"
        paths[label] = folder / f"{len(paths)}.pt"
        torch.save({"value": obj}, paths[label])
    preload = sorted({e.module for e in INERT})
    results = audited_load(paths, preload=preload)
    verdicts = dict(zip(paths, scan([str(p) for p in paths.values()]).files, strict=True))
    return paths, results, verdicts


@pytest.mark.parametrize("label", [f"{e.module}.{e.name}" for e in INERT])
def test_inert_third_party_entry_loads_without_side_effect_and_scans_safe(samples, label):
    paths, results, verdicts = samples
    if label not in paths:
        pytest.fail(f"{label}: the test builds no instance of it; add one to catalog_samples._SPECIAL")
    assert results[label] == "loaded", results[label]
    f = verdicts[label]
    assert f.verdict == "safe", (label, [(g.qualname, g.severity) for g in f.globals], f.findings)


def test_every_catalogued_torchao_tensor_uses_the_reviewed_setstate():
    """The review read TorchAOBaseTensor's __setstate__; a subclass that defines its own is not covered by it."""
    import torchao.quantization as q
    from torchao.utils import _torchao_base_tensor__setstate__

    names = [e.name for e in third_party.ENTRIES if e.module == "torchao.quantization"]
    assert names
    for name in names:
        assert getattr(q, name).__setstate__ is _torchao_base_tensor__setstate__, name


def test_an_excluded_entry_stays_dangerous(tmp_path):
    from lightning_fabric.utilities.data import _WrapAttrTag

    path = tmp_path / "tag.pt"
    torch.save({"tag": _WrapAttrTag.SET}, path)
    (f,) = scan([str(path)]).files
    assert f.verdict == "dangerous"
