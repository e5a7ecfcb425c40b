"""Every file a library's resume code opens in its folder, and how: the list inspect judges besides the weights.

Derived from the libraries' loading code (paths relative to site-packages/):

transformers 5.24.0, ``Trainer`` resuming from ``checkpoint-N/``
(``train(resume_from_checkpoint=...)``):

- transformers/trainer.py:3696/3699 ``_load_from_checkpoint``: ``model.safetensors``
  (safetensors) or ``pytorch_model.bin`` (``torch.load(weights_only=True)``), or their index's shards
  (``load_sharded_checkpoint``);
- trainer.py:3948-3961 ``_load_optimizer_and_scheduler``: ``optimizer.pt`` and ``scheduler.pt``,
  ``rank*-of-N-optimizer.pt`` (3927: model-parallel ranks), each ``torch.load(weights_only=True)``;
- trainer.py:4015/4024 ``_load_scaler``: ``scaler.pt``, ``torch.load(weights_only=True)``;
- trainer.py:3857/3865/3875 ``_load_rng_state``: ``rng_state.pth`` or ``rng_state_{process}.pth``,
  ``torch.load(weights_only=True)`` (NumPy's RNG globals allowlisted);
- ``training_args.bin`` (trainer.py:4185 ``torch.save(self.args)``) is not read back by the Trainer, but by
  the scripts that reload a run's arguments, and only ``torch.load(weights_only=False)`` opens it (it holds a
  ``TrainingArguments``): it is judged as such.

accelerate 1.15.0, ``Accelerator.load_state`` (accelerator.py:3791 -> checkpointing.py:183
``load_accelerator_state``), each through ``accelerate.utils.other.load`` (other.py:460: ``torch.load`` with
``weights_only=True`` unless asked otherwise, NumPy globals allowlisted):

- checkpointing.py:241/247: ``model[_i].safetensors`` or ``pytorch_model[_i].bin``;
- checkpointing.py:255/263/276/281: ``optimizer[_i].bin``, ``scheduler[_i].bin``, ``sampler[_i].bin``,
  ``dl_state_dict[_i].bin``;
- checkpointing.py:288/294: ``scaler.pt``, ``random_states_{process}.pkl``;
- accelerator.py:3926 + checkpointing.py:340 ``load_custom_state``: every ``custom_checkpoint_{i}.pkl``,
  with ``weights_only=False``: the objects registered with ``register_for_checkpointing``.

Lightning 2.6 writes one ``.ckpt`` file (a single torch.save file, judged as one) or, with its DeepSpeed
strategy, a DeepSpeed checkpoint folder (formats/deepspeed/opened.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .folders import Folder, Library

WEIGHTS_ONLY = "torch.load(weights_only=True)"
UNSAFE = "torch.load(weights_only=False)"


@dataclass(frozen=True)
class Opened:
    """One file of the folder its library's loader opens: its name, how, and the line that does it."""

    name: str  # relative to the folder
    how: str
    by: str


_TRANSFORMERS = (
    (re.compile(r"^(optimizer\.pt|rank\d+-of-\d+-optimizer\.pt)$"), WEIGHTS_ONLY,
     "transformers/trainer.py:3948 _load_optimizer_and_scheduler"),
    (re.compile(r"^scheduler\.pt$"), WEIGHTS_ONLY, "transformers/trainer.py:3961 _load_optimizer_and_scheduler"),
    (re.compile(r"^scaler\.pt$"), WEIGHTS_ONLY, "transformers/trainer.py:4015 _load_scaler"),
    (re.compile(r"^rng_state(_\d+)?\.pth$"), WEIGHTS_ONLY, "transformers/trainer.py:3875 _load_rng_state"),
    (re.compile(r"^training_args\.bin$"), UNSAFE,
     "transformers/trainer.py:4185 torch.save(self.args); read back with torch.load(weights_only=False)"),
)
_ACCELERATE = (
    (re.compile(r"^(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin$"), WEIGHTS_ONLY,
     "accelerate/checkpointing.py:255-281 load_accelerator_state"),
    (re.compile(r"^scaler\.pt$"), WEIGHTS_ONLY, "accelerate/checkpointing.py:288 load_accelerator_state"),
    (re.compile(r"^random_states_\d+\.pkl$"), WEIGHTS_ONLY, "accelerate/checkpointing.py:294 load_accelerator_state"),
    (re.compile(r"^custom_checkpoint_\d+\.pkl$"), UNSAFE, "accelerate/checkpointing.py:340 load_custom_state"),
)


def opened(found: Folder) -> tuple[Opened, ...]:
    """The state files (not the weights, read on their own) that ``found``'s library opens, in name order."""
    rules = {Library.TRANSFORMERS: _TRANSFORMERS, Library.ACCELERATE: _ACCELERATE}.get(found.library)
    if rules is None:
        return ()
    out = []
    for name in sorted(found.files):
        for pattern, how, by in rules:
            if pattern.match(name):
                out.append(Opened(name, how, by))
                break
    return tuple(out)
