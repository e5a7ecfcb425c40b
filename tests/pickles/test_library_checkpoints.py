"""The benign corpus harvested from libraries: checkpoints written by their own saving code, never a false alarm.

One child process runs each installed library's real training-and-saving path (transformers' Trainer.train with
a save step, accelerate's save_state with a custom object, mmengine's Runner with its CheckpointHook,
pytorch-ignite's Checkpoint handler, Lightning's Trainer.fit + save_checkpoint with an OmegaConf
hyper-parameter). Each file must scan safe, pass gate's loads-safely, inspect without a dangerous warning, and
load with torch.load(weights_only=False) in an audited child without a side effect. A library that is not
installed skips its case, saying so (all are test-only, pinned in constraints.txt).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_tool import gate, inspect, scan
from tests.catalog_samples import audited_load

LIBRARIES = {  # case -> the modules its writer needs
    "transformers": ("transformers", "accelerate"),
    "accelerate": ("accelerate",),
    "mmengine": ("mmengine",),
    "ignite": ("ignite",),
    "lightning": ("pytorch_lightning", "omegaconf"),
}

WRITE = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    out, cases = sys.argv[1], sys.argv[2].split(",")
    written = {}

    def linear_data(n=4):
        return [dict(x=torch.ones(2), y=torch.zeros(1)) for _ in range(n)]

    if "transformers" in cases:
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
        model = BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                                         intermediate_size=8, vocab_size=16, num_labels=2))
        data = [dict(input_ids=torch.tensor([1, 2, 3]), labels=torch.tensor(1)) for _ in range(4)]
        args = TrainingArguments(output_dir=os.path.join(out, "trainer"), report_to="none", use_cpu=True,
                                 max_steps=1, save_steps=1, per_device_train_batch_size=2, logging_steps=1)
        Trainer(model=model, args=args, train_dataset=data).train()
        written["transformers"] = [os.path.join(out, "trainer", "checkpoint-1")]

    if "accelerate" in cases:
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration
        acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
            project_dir=os.path.join(out, "acc"), automatic_checkpoint_naming=True))
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)

        class Counter:
            def __init__(self): self.n = 3
            def state_dict(self): return {"n": self.n}
            def load_state_dict(self, sd): self.n = sd["n"]

        model, opt, sched = acc.prepare(model, opt, sched)
        acc.register_for_checkpointing(Counter())
        acc.save_state()
        written["accelerate"] = [os.path.join(out, "acc", "checkpoints", "checkpoint_0")]

    if "mmengine" in cases:
        from mmengine.model import BaseModel
        from mmengine.runner import Runner

        class M(BaseModel):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(2, 1)
            def forward(self, x, y=None, mode="tensor"):
                out_ = self.fc(x)
                return {"loss": ((out_ - y) ** 2).mean()} if mode == "loss" else out_

        Runner(model=M(), work_dir=os.path.join(out, "mm"),
               train_dataloader=dict(dataset=linear_data(), batch_size=2, collate_fn=dict(type="default_collate"),
                                     sampler=dict(type="DefaultSampler", shuffle=False)),
               train_cfg=dict(by_epoch=True, max_epochs=1), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
               default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1))).train()
        written["mmengine"] = [os.path.join(out, "mm", "epoch_1.pth")]

    if "ignite" in cases:
        from ignite.engine import Engine, Events
        from ignite.handlers import Checkpoint, DiskSaver
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def step(engine, batch):
            opt.zero_grad(); loss = model(batch).sum(); loss.backward(); opt.step(); return loss.item()
        trainer = Engine(step)
        to_save = {"model": model, "optimizer": opt, "trainer": trainer,
                   "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}
        trainer.add_event_handler(Events.EPOCH_COMPLETED, Checkpoint(to_save, DiskSaver(
            os.path.join(out, "ignite"), require_empty=False), n_saved=1))
        trainer.run([torch.ones(2, 2)] * 2, max_epochs=1)
        written["ignite"] = [os.path.join(out, "ignite", n) for n in os.listdir(os.path.join(out, "ignite"))]

    if "lightning" in cases:
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

        cfg = OmegaConf.create({"model": {"width": 2, "layers": [1, {"act": "relu"}]}, "seed": 3})
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
        t = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, accelerator="cpu", default_root_dir=out)
        t.fit(Tiny(cfg), data)
        t.save_checkpoint(os.path.join(out, "lightning.ckpt"))
        written["lightning"] = [os.path.join(out, "lightning.ckpt")]
    print("WRITTEN " + json.dumps(written))
    """
)

# modules imported before the audit starts (a library's import-time code is its own; the audit judges unpickling)
PRELOAD = {"transformers": ("transformers.training_args", "accelerate.state"),
           "mmengine": ("mmengine.logging.history_buffer",)}
AVAILABLE = [c for c, mods in LIBRARIES.items() if all(importlib.util.find_spec(m) for m in mods)]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, list[str]]:
    if not AVAILABLE:
        pytest.skip("none of the test-only libraries is installed (requirements-test.txt)")
    out = tmp_path_factory.mktemp("library_checkpoints")
    proc = subprocess.run([sys.executable, "-c", WRITE, str(out), ",".join(AVAILABLE)], capture_output=True,
                          text=True, timeout=600, check=False, cwd=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("WRITTEN "))
    result: dict[str, list[str]] = json.loads(line.removeprefix("WRITTEN "))
    return result


def _pickled_files(paths: list[str]) -> list[Path]:
    """Every file a loader would torch.load: the paths, and a folder's .pt/.pth/.bin/.pkl/.ckpt files."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.suffix in (".pt", ".pth", ".bin", ".pkl", ".ckpt"))
        else:
            out.append(p)
    return out


@pytest.mark.parametrize("case", list(LIBRARIES))
def test_library_checkpoint_is_never_a_false_alarm(written, case):
    if case not in AVAILABLE:
        pytest.skip(f"{case}: needs {', '.join(LIBRARIES[case])} (test-only, requirements-test.txt)")
    paths = written[case]
    files = _pickled_files(paths)
    assert files, paths
    report = scan([str(f) for f in files])
    flagged = {f.path: [(g.qualname, g.severity.value) for g in f.globals if g.severity.value != "safe"]
               for f in report.files if f.verdict != "safe"}
    assert flagged == {}, flagged
    for f in files:
        checks = {c.name.value: c for c in gate([str(f)]).files[0].checks}
        assert checks["loads-safely"].passed, (f, checks["loads-safely"].detail)
    for p in paths:
        ck = inspect(p)
        assert not [w for w in ck.warnings if "dangerous" in w], (p, ck.warnings)
    labels = {f"{case}.{i}": f for i, f in enumerate(files)}
    assert set(audited_load(labels, preload=PRELOAD.get(case, LIBRARIES[case])).values()) == {"loaded"}


def _globals(path: str) -> dict[str, str]:
    (f,) = scan([path]).files
    return {g.qualname: g.severity.value for g in f.globals}


def test_the_catalogued_library_classes_are_what_the_files_hold(written):
    """The third-party reviews (catalog/third_party.py) cover what the libraries' own code pickles."""
    if "transformers" in AVAILABLE:
        judged = _globals(str(Path(written["transformers"][0]) / "training_args.bin"))
        assert {"transformers.training_args.TrainingArguments", "accelerate.state.PartialState"} <= set(judged)
    if "lightning" in AVAILABLE:
        judged = _globals(written["lightning"][0])
        assert {"omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig"} <= set(judged)
    if "mmengine" in AVAILABLE:
        assert "mmengine.logging.history_buffer.HistoryBuffer" in _globals(written["mmengine"][0])


def test_gate_loads_safely_passes_and_weights_only_fails_on_training_args(written):
    """loads-safely and weights-only stay separate questions: torch's restricted loader refuses these classes."""
    if "transformers" not in AVAILABLE:
        pytest.skip("needs transformers and accelerate (test-only)")
    checks = {c.name.value: c for c in gate([str(Path(written["transformers"][0]) / "training_args.bin")]).files[0]
              .checks}
    assert checks["loads-safely"].passed and not checks["weights-only"].passed
