"""The names of the formats ckpt reads and writes, declared once for every layer.

They are ``str`` Enums so that JSON, messages and old comparisons with the
plain strings (``report.format == "torch-zip"``) keep working unchanged.
"""
from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    """A closed set of names whose ``str()`` is the name itself (``enum.StrEnum`` is Python 3.11+).

    Every closed vocabulary of the package (formats, severities, check names, ...) derives from it.
    """

    def __str__(self) -> str:
        return str(self.value)


class Format(Name):
    """What a file or folder is, as detect.py tells it from its bytes (never from its name)."""

    TORCH_ZIP = "torch-zip"
    TORCHSCRIPT = "torchscript"
    TORCH_LEGACY = "torch-legacy"
    TORCH_TAR = "torch-tar"  # torch 0.1.x tar-based checkpoints
    PICKLE = "pickle"
    DILL = "dill"  # a pickle that uses dill's by-value globals (read like PICKLE)
    SAFETENSORS = "safetensors"
    SHARDED = "sharded"  # a ``*.index.json`` weight map over safetensors or .bin shards
    DCP = "dcp"
    DEEPSPEED = "deepspeed"  # a DeepSpeed run folder (``latest``) or tag folder, read as the consolidated model
    TORCH_EXPORT = "torch-export"  # a torch.export.save ``.pt2`` archive (formats/torchsave/export.py)
    # A folder a library wrote (save_pretrained, PEFT, diffusers, sentence-transformers, Trainer, accelerate):
    # what detect says of it; the report's format is that of the weights it holds (formats/hf/read.py).
    HF_FOLDER = "hf-folder"
    # A state dict or an nn.Module handed to the Python API (``ckpt_tool.diff(model.state_dict(), ...)``): no file,
    # its tensors are read where they are (tensors/live.py, commands/inputs.py).
    IN_MEMORY = "in-memory"
    # Megatron-LM's legacy checkpoint folder (``mp_rank_XX/model_optim_rng.pt`` per tensor-parallel rank),
    # merged by the user's rules (formats/megatron/legacy_folder.py)
    MEGATRON_LEGACY = "megatron-legacy"
    # torch.distributed.checkpoint's HuggingFaceStorageWriter(save_distributed=True): one safetensors file per
    # rank holding slices placed by DCP_SHARDING_INFO, read as the consolidated model (formats/safetensors/)
    DIST_SAFETENSORS = "distributed-safetensors"
    # A folder of per-rank torch.save files of DTensor/ShardedTensor state dicts (verl's model_world_size_N_rank_K.pt,
    # an FSDP2 state_dict() or FSDP1 SHARDED_STATE_DICT saved by each rank), read as the consolidated model
    RANKS = "ranks"
    # NumPy's np.save (one array, or an object array's pickle) and np.savez/np.savez_compressed archives,
    # also what MLX's mx.save/mx.savez write (formats/numpy/)
    NUMPY = "numpy"
    NPZ = "npz"


class OutputFormat(Name):
    """What ``ckpt migrate`` can write; each has one writer (writers/)."""

    TORCH_ZIP = "torch-zip"
    SAFETENSORS = "safetensors"
    SHARDED = "sharded"
    DCP = "dcp"
    # a folder from_pretrained loads: the weights as safetensors (sharded with an index when asked) beside the
    # source folder's config, tokenizer and other small files (writers/hf_folder.py)
    HF_FOLDER = "hf-folder"


class DeepSpeedLayout(Name):
    """How a DeepSpeed checkpoint is parallelised (metadata["deepspeed"]["layout"])."""

    ZERO = "zero"  # data-parallel only: ZeRO partitions of one model
    PIPELINE = "pipeline"  # layer_XX files, one mp_rank_XX per pipeline stage
    TENSOR_PARALLEL = "tensor-parallel"  # one mp_rank_XX per tensor-parallel rank, merged by rules
    UNIVERSAL = "universal"  # ds_to_universal's output: zero/<param>/fp32.pt, already merged


class TpMerge(Name):
    """How the tensor-parallel shards of one tensor become the whole tensor (formats/tp/tprules.py)."""

    CONCAT = "concat"  # the ranks' pieces concatenated along ``dim``
    REPLICATED = "replicated"  # every rank holds the whole tensor (checked equal), written once
    TWO_SUB_PARAMS = "two-sub-params"  # two fused halves, each split along dim 0 (DeepSpeed's SwiGLU case)
    SUB_PARAMS = "sub-params"  # fused sub-parameters (q, k, v), each split over the ranks by recorded widths
    AFFINE = "affine-map"  # pieces placed where AutoTP's affine_map says (fused q/k/v, uneven widths, replicas)


class DiffMetric(Name):
    """A per-tensor figure of ``ckpt diff --values`` that ``--sort`` orders by (commands/diff/rollup.py):
    every order puts the largest change first."""

    REL_L2 = "rel_l2"
    MAX_ABS = "max_abs"
    MAX_REL = "max_rel"
    MEAN_ABS = "mean_abs"
    COSINE = "cosine"  # ascending: the lowest similarity is the largest change
    MISMATCHED_SHARE = "mismatched_share"
    NUMEL = "numel"
    KEY = "key"  # alphabetical
