"""Third-party classes libraries routinely put in checkpoints, reviewed from their source.

Each entry names the version its review read (``Entry.reviewed``). Classes of other libraries
and of users stay outside the catalog: the report says they are not reviewed. The Enums and
dataclasses of the modules in tools/catalog_candidates.py's THIRD_PARTY are enumerated there, so
a library upgrade that adds one is seen; the other classes below were found in real files
(tests/pickles/test_third_party_catalog.py writes them with the libraries' own code).
"""
from __future__ import annotations

from .entry import Entry

_TF = "transformers 5.24.0"
_ACC = "accelerate 1.15.0"
_OMEGA = "omegaconf 2.3.1"
_PL = "pytorch-lightning 2.6.6"
_MM = "mmengine 0.10.7"
_AO = "torchao 0.18.0"

_ENUM = ("an Enum (transformers' ExplicitEnum / accelerate's BaseEnum are str Enums whose _missing_ only raises "
         "ValueError): unpickling looks an existing member up by value")
_DATACLASS = ("a dataclass with no __setstate__, __reduce__, __getattr__ or __setattr__ of its own: unpickled by "
              "NEWOBJ + a __dict__ update, which never runs __post_init__ (where it reads files or the "
              "environment); a callable it holds is a separate global, judged on its own")
_NAMEDTUPLE = "a NamedTuple of Trainer results: the generated __new__ only builds the tuple"


def _each(module: str, names: str, reason: str, reviewed: str) -> tuple[Entry, ...]:
    return tuple(Entry(module, name, "inert", reason, reviewed) for name in names.split())


ENTRIES: tuple[Entry, ...] = (
    # transformers: Trainer's training_args.bin is torch.save(TrainingArguments) (trainer.py _save).
    *_each("transformers.training_args", "TrainingArguments", _DATACLASS + " (training_args.py: @dataclass, "
           "no pickle hooks; cached properties only store values)", _TF),
    *_each("transformers.training_args_seq2seq", "Seq2SeqTrainingArguments", _DATACLASS, _TF),
    *_each("transformers.trainer_pt_utils", "AcceleratorConfig LabelSmoother", _DATACLASS, _TF),
    *_each("transformers.training_args", "OptimizerNames ParallelMode", _ENUM, _TF),
    *_each("transformers.trainer_utils", "FSDPOption HPSearchBackend HubStrategy IntervalStrategy SaveStrategy "
           "SchedulerType", _ENUM, _TF),
    *_each("transformers.trainer_utils", "BestRun EvalLoopOutput PredictionOutput TrainOutput", _NAMEDTUPLE, _TF),
    *_each("transformers.debug_utils", "DebugOption", _ENUM, _TF),
    *_each("transformers.integrations.deepspeed", "HfDeepSpeedConfig HfTrainerDeepSpeedConfig",
           "TrainingArguments.hf_deepspeed_config under DeepSpeed: a plain class holding the config dict; its "
           "__init__ (which reads the config file and registers a weakref) is not run by NEWOBJ + BUILD", _TF),
    # accelerate: TrainingArguments.distributed_state, .accelerator_config and the plugins they hold.
    Entry("accelerate.state", "PartialState", "inert",
          "TrainingArguments.distributed_state: a Borg singleton whose __init__ (never run by NEWOBJ) shares the "
          "class's state dict; unpickled, BUILD fills the new instance's own __dict__, and BUILD's "
          "getattr(__setstate__) reaches its __getattr__, which only raises AttributeError (state.py)", _ACC),
    *_each("accelerate.utils.deepspeed", "HfDeepSpeedConfig",
           "a plain class holding the DeepSpeed config dict; NEWOBJ + BUILD only fill __dict__", _ACC),
    *_each("accelerate.utils.dataclasses", "ComputeEnvironment CustomDtype DDPCommunicationHookType "
           "DistributedType DynamoBackend FP8BackendType LoggerType PrecisionType RNGType "
           "SageMakerDistributedType", _ENUM, _ACC),
    *_each("accelerate.utils.dataclasses", "AORecipeKwargs AutocastKwargs BnbQuantizationConfig "
           "DataLoaderConfiguration DeepSpeedPlugin DeepSpeedSequenceParallelConfig DistributedDataParallelKwargs "
           "FP8RecipeKwargs FullyShardedDataParallelPlugin GradScalerKwargs GradientAccumulationPlugin "
           "InitProcessGroupKwargs MSAMPRecipeKwargs MegatronLMPlugin ProfileKwargs ProjectConfiguration "
           "TERecipeKwargs TensorInformation TorchContextParallelConfig TorchDynamoPlugin "
           "TorchTensorParallelConfig TorchTensorParallelPlugin", _DATACLASS, _ACC),
    Entry("accelerate.utils.dataclasses", "BaseEnum", "excluded",
          "an Enum base class without members: called with several arguments it is the functional API (builds a "
          "class at load); a pickled member names its own class, never this", _ACC),
    # omegaconf: Hydra configs and Lightning hyper_parameters hold DictConfig/ListConfig trees.
    *_each("omegaconf.dictconfig", "DictConfig",
           "BaseContainer.__setstate__ (basecontainer.py) fills defaults for missing key/element types, rewrites "
           "a container ref_type from the typing annotations it holds, then updates __dict__; NEWOBJ runs no "
           "__init__", _OMEGA),
    *_each("omegaconf.listconfig", "ListConfig", "BaseContainer.__setstate__, as DictConfig", _OMEGA),
    *_each("omegaconf.nodes", "AnyNode StringNode PathNode IntegerNode BytesNode FloatNode BooleanNode EnumNode "
           "InterpolationResultNode", "a value node: Node.__setstate__ (base.py) updates __dict__ and clears "
           "the flags cache; an EnumNode's enum class is a separate global", _OMEGA),
    *_each("omegaconf.base", "Metadata ContainerMetadata", _DATACLASS, _OMEGA),
    *_each("omegaconf.base", "SCMode", _ENUM, _OMEGA),
    # mmengine: every Runner checkpoint's meta.message_hub holds HistoryBuffers (logging/history_buffer.py).
    Entry("mmengine.logging.history_buffer", "HistoryBuffer", "inert",
          "its __setstate__ sets the default statistics (min, max, current, mean: its own methods), merges the "
          "pickled statistics_methods into the class's registry, then updates __dict__; the callables merged are "
          "separate globals, judged on their own (mmengine pickles its own methods, reached by getattr)", _MM),
    *(Entry("mmengine.logging.history_buffer", f"HistoryBuffer.{m}", "inert",
            "a HistoryBuffer statistic (numpy over its log history), pickled by reference as "
            f"getattr(HistoryBuffer, {m!r}); referenced, never called at load", _MM)
      for m in ("min", "max", "current", "mean")),
    # torchao: quantize_'s state dicts hold its tensor subclasses (utils.py TorchAOBaseTensor) and their configs.
    # (the Int4* and IntxOpaque tensors share that __setstate__, but their packing needs kernels this CPU build
    # lacks, so no test builds one: left outside until one does)
    *_each("torchao.quantization", "Int8Tensor Float8Tensor IntxUnpackedToInt8Tensor",
           "a TorchAOBaseTensor: rebuilt by torch's _rebuild_wrapper_subclass (_make_wrapper_subclass, no class code), "
           "then TorchAOBaseTensor's __setstate__ (_torchao_base_tensor__setstate__, set on every subclass by "
           "__init_subclass__): torch._utils._set_obj_state, and None for missing optional attributes", _AO),
    *_each("torchao.quantization.granularity", "PerAxis PerBlock PerGroup PerRow PerTensor PerToken",
           "a frozen dataclass of a quantization granularity (a dim, a group or block size): NEWOBJ + a __dict__ "
           "update", _AO),
    Entry("torchao.quantization.granularity", "Granularity", "inert", "the granularities' empty base dataclass",
          _AO),
    *_each("torchao.quantization.quant_primitives", "MappingType TorchAODType ZeroPointDomain", _ENUM, _AO),
    *_each("torchao.quantization.quantize_.common.kernel_preference", "KernelPreference", _ENUM, _AO),
    *_each("torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor",
           "IntxUnpackedToInt8TensorActivationQuantization", _ENUM, _AO),
    *_each("torchao.quantization.quantize_.workflows.int8.int8_tensor", "QuantizeTensorToInt8Kwargs", _DATACLASS,
           _AO),
    *_each("torchao.quantization.quantize_.workflows.float8.float8_tensor", "QuantizeTensorToFloat8Kwargs",
           _DATACLASS, _AO),
    # Lightning: a .ckpt's hyper_parameters (save_hyperparameters) is an AttributeDict.
    *_each("lightning_fabric.utilities.data", "AttributeDict",
           "a dict subclass with attribute access: NEWOBJ (dict.__new__) + SETITEMS; BUILD's "
           "getattr(__setstate__) reaches its __getattr__, a dict lookup that raises AttributeError", _PL),
    Entry("lightning_fabric.utilities.data", "_WrapAttrTag", "excluded",
          "an Enum whose members are callable: _WrapAttrTag.SET(obj, name, value) is setattr (data.py)", _PL),
    *_each("pytorch_lightning.utilities.parsing", "AttributeDict",
           "lightning_fabric's AttributeDict under pytorch_lightning's name (a subclass adding nothing that runs "
           "at load)", _PL),
)
