"""Write real checkpoints with the real training libraries, for tests/formats/test_third_party.py.

    python tests/helpers/third_party_writers.py OUT_DIR

Run in its own interpreter (importing transformers and lightning costs
seconds; once per test session). Each writer trains a tiny model for two
steps on random data on the CPU, nothing downloaded, and saves the way the
library does for its users. Prints one JSON object: writer -> folder, or
``{"skipped": reason}`` where the library is not installed.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def lightning_ckpt(out: str) -> str:
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self, hidden: int = 8, lr: float = 0.01, name: str = "tiny", cfg: object = None) -> None:
            super().__init__()
            self.save_hyperparameters()  # cfg: a Hydra/OmegaConf config, as Hydra users pass theirs
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

        def training_step(self, batch, _idx):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    folder = os.path.join(out, "lightning")
    cb = pl.callbacks.ModelCheckpoint(dirpath=folder, filename="last", save_top_k=1, monitor=None)
    early = pl.callbacks.EarlyStopping(monitor="train_loss", mode="min", check_on_train_epoch_end=True)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[cb, early], default_root_dir=folder)
    cfg = None
    try:
        from omegaconf import OmegaConf

        cfg = OmegaConf.create({"model": {"width": 8, "layers": [1, {"act": "relu"}], "tag": "${model.width}"}})
    except ImportError:
        pass
    trainer.fit(Tiny(cfg=cfg), data)
    return folder


def hf_trainer(out: str) -> str:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    rows = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(8)]
    folder = os.path.join(out, "hf_trainer")
    args = TrainingArguments(output_dir=folder, max_steps=2, save_steps=2, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=rows).train()
    return os.path.join(folder, "checkpoint-2")


def accelerate_state(out: str) -> str:
    import torch
    from accelerate import Accelerator

    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    model, opt, sched = acc.prepare(model, opt, sched)

    class Counter:  # an object registered for checkpointing: custom_checkpoint_0.pkl holds its state_dict()
        def __init__(self) -> None:
            self.n = 3

        def state_dict(self) -> dict[str, int]:
            return {"n": self.n}

        def load_state_dict(self, sd: dict[str, int]) -> None:
            self.n = sd["n"]

    acc.register_for_checkpointing(Counter())
    for _ in range(2):
        loss = model(torch.randn(3, 4)).sum()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
    folder = os.path.join(out, "accelerate")
    acc.save_state(folder)
    return folder


def mmengine_runner(out: str) -> str:
    """An mmengine Runner with its CheckpointHook (meta.message_hub holds HistoryBuffers)."""
    import torch
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class M(BaseModel):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(2, 1)

        def forward(self, x, y=None, mode="tensor"):  # type: ignore[no-untyped-def]
            pred = self.fc(x)
            return {"loss": ((pred - y) ** 2).mean()} if mode == "loss" else pred

    folder = os.path.join(out, "mmengine")
    data = [{"x": torch.ones(2), "y": torch.zeros(1)} for _ in range(4)]
    Runner(model=M(), work_dir=folder,
           train_dataloader={"dataset": data, "batch_size": 2, "collate_fn": {"type": "default_collate"},
                             "sampler": {"type": "DefaultSampler", "shuffle": False}},
           train_cfg={"by_epoch": True, "max_epochs": 1}, optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.1}},
           default_hooks={"checkpoint": {"type": "CheckpointHook", "interval": 1}}).train()
    return folder


def ignite_checkpoint(out: str) -> str:
    """pytorch-ignite's Checkpoint handler: model, optimizer, engine and scheduler state dicts."""
    import torch
    from ignite.engine import Engine, Events
    from ignite.handlers import Checkpoint, DiskSaver

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(engine, batch):  # type: ignore[no-untyped-def]
        opt.zero_grad()
        loss = model(batch).sum()
        loss.backward()
        opt.step()
        return loss.item()

    trainer = Engine(step)
    folder = os.path.join(out, "ignite")
    to_save = {"model": model, "optimizer": opt, "trainer": trainer,
               "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}
    trainer.add_event_handler(Events.EPOCH_COMPLETED, Checkpoint(to_save, DiskSaver(folder, require_empty=False),
                                                                 n_saved=1))
    trainer.run([torch.ones(2, 2)] * 2, max_epochs=1)
    return folder


WRITERS = {"lightning": lightning_ckpt, "hf_trainer": hf_trainer, "accelerate": accelerate_state,
           "mmengine": mmengine_runner, "ignite": ignite_checkpoint}
NEEDS = {"lightning": "pytorch_lightning", "hf_trainer": "transformers", "accelerate": "accelerate",
         "mmengine": "mmengine", "ignite": "ignite"}


def main(out: str) -> int:
    import importlib.util

    result: dict[str, object] = {}
    for name, writer in WRITERS.items():
        if importlib.util.find_spec(NEEDS[name]) is None:
            result[name] = {"skipped": f"{NEEDS[name]} is not installed (pip install -r requirements-test.txt)"}
            continue
        result[name] = writer(out)
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
