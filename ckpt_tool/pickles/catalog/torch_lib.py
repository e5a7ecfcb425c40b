"""torch classes a pickle may construct without side effects (reviewed against torch 2.13).

Enumerated by tools/catalog_candidates.py from the modules it lists (enums, namedtuples, structseqs
and dataclasses), then decided by reading each class: an entry is inert when construction as pickle
performs it (NEWOBJ/REDUCE, then BUILD) only stores its fields. The tensor rebuilds, DTensor,
DCP metadata and ShardedTensor records ckpt accepted before stay in pickles/inert.py's REVIEWED.
"""
from __future__ import annotations

from .entry import Entry

_T = "torch 2.13"
_ENUM = "an Enum of torch's: unpickling looks an existing member up by value (Enum.__new__), nothing else"
_DATACLASS = "a dataclass of torch's with no __setstate__/__reduce__ of its own: NEWOBJ + __dict__ update"
_FSDP = "FSDP configuration (torch/distributed/fsdp/api.py), saved beside FSDP state dicts: "
_FSDP2 = "FSDP2 policy (torch/distributed/fsdp/_fully_shard/_fsdp_api.py), kept in training states: "
_DCP = "torch.distributed.checkpoint planning record (planner.py / state_dict.py): "
_NN = ("a torch.nn module of a whole-model pickle: NEWOBJ (object.__new__) then nn.Module.__setstate__, which "
       "updates __dict__ and fills missing hook dicts; hooks it holds are judged as the globals they name and run "
       "only when the model runs, never at load")
# torch.nn's own modules, as torch.nn exports them (tools/catalog_candidates.py lists them). Those with a
# __setstate__ of their own were read: _ConvNd (padding_mode default), RNNBase (weight name lists, weakrefs),
# MultiheadAttention, Softmax/Softmin/LogSoftmax (dim default), Upsample (recompute_scale_factor default),
# Transformer{En,De}coderLayer (activation flag default), AvgPool3d (padding defaults): each only sets
# attributes. Container.__new__ and NLLLoss2d.__new__ only warn that they are deprecated.
NN_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch.nn.modules.activation", (
        'CELU', 'ELU', 'GELU', 'GLU', 'Hardshrink', 'Hardsigmoid', 'Hardswish', 'Hardtanh', 'LeakyReLU',
        'LogSigmoid', 'LogSoftmax', 'Mish', 'MultiheadAttention', 'PReLU', 'RReLU', 'ReLU', 'ReLU6', 'SELU', 'SiLU',
        'Sigmoid', 'Softmax', 'Softmax2d', 'Softmin', 'Softplus', 'Softshrink', 'Softsign', 'Tanh', 'Tanhshrink',
        'Threshold',
    )),
    ("torch.nn.modules.adaptive", (
        'AdaptiveLogSoftmaxWithLoss',
    )),
    ("torch.nn.modules.batchnorm", (
        'BatchNorm1d', 'BatchNorm2d', 'BatchNorm3d', 'LazyBatchNorm1d', 'LazyBatchNorm2d', 'LazyBatchNorm3d',
        'SyncBatchNorm',
    )),
    ("torch.nn.modules.channelshuffle", (
        'ChannelShuffle',
    )),
    ("torch.nn.modules.container", (
        'Container', 'ModuleDict', 'ModuleList', 'ParameterDict', 'ParameterList', 'Sequential',
    )),
    ("torch.nn.modules.conv", (
        'Conv1d', 'Conv2d', 'Conv3d', 'ConvTranspose1d', 'ConvTranspose2d', 'ConvTranspose3d', 'LazyConv1d',
        'LazyConv2d', 'LazyConv3d', 'LazyConvTranspose1d', 'LazyConvTranspose2d', 'LazyConvTranspose3d',
    )),
    ("torch.nn.modules.distance", (
        'CosineSimilarity', 'PairwiseDistance',
    )),
    ("torch.nn.modules.dropout", (
        'AlphaDropout', 'Dropout', 'Dropout1d', 'Dropout2d', 'Dropout3d', 'FeatureAlphaDropout',
    )),
    ("torch.nn.modules.flatten", (
        'Flatten', 'Unflatten',
    )),
    ("torch.nn.modules.fold", (
        'Fold', 'Unfold',
    )),
    ("torch.nn.modules.instancenorm", (
        'InstanceNorm1d', 'InstanceNorm2d', 'InstanceNorm3d', 'LazyInstanceNorm1d', 'LazyInstanceNorm2d',
        'LazyInstanceNorm3d',
    )),
    ("torch.nn.modules.linear", (
        'Bilinear', 'Identity', 'LazyLinear', 'Linear',
    )),
    ("torch.nn.modules.loss", (
        'BCELoss', 'BCEWithLogitsLoss', 'CTCLoss', 'CosineEmbeddingLoss', 'CrossEntropyLoss', 'GaussianNLLLoss',
        'HingeEmbeddingLoss', 'HuberLoss', 'KLDivLoss', 'L1Loss', 'LinearCrossEntropyLoss', 'MSELoss',
        'MarginRankingLoss', 'MultiLabelMarginLoss', 'MultiLabelSoftMarginLoss', 'MultiMarginLoss', 'NLLLoss',
        'NLLLoss2d', 'PoissonNLLLoss', 'SmoothL1Loss', 'SoftMarginLoss', 'TripletMarginLoss',
        'TripletMarginWithDistanceLoss',
    )),
    ("torch.nn.modules.module", (
        'Module',
    )),
    ("torch.nn.modules.normalization", (
        'CrossMapLRN2d', 'GroupNorm', 'LayerNorm', 'LocalResponseNorm', 'RMSNorm',
    )),
    ("torch.nn.modules.padding", (
        'CircularPad1d', 'CircularPad2d', 'CircularPad3d', 'ConstantPad1d', 'ConstantPad2d', 'ConstantPad3d',
        'ReflectionPad1d', 'ReflectionPad2d', 'ReflectionPad3d', 'ReplicationPad1d', 'ReplicationPad2d',
        'ReplicationPad3d', 'ZeroPad1d', 'ZeroPad2d', 'ZeroPad3d',
    )),
    ("torch.nn.modules.pixelshuffle", (
        'PixelShuffle', 'PixelUnshuffle',
    )),
    ("torch.nn.modules.pooling", (
        'AdaptiveAvgPool1d', 'AdaptiveAvgPool2d', 'AdaptiveAvgPool3d', 'AdaptiveMaxPool1d', 'AdaptiveMaxPool2d',
        'AdaptiveMaxPool3d', 'AvgPool1d', 'AvgPool2d', 'AvgPool3d', 'FractionalMaxPool2d', 'FractionalMaxPool3d',
        'LPPool1d', 'LPPool2d', 'LPPool3d', 'MaxPool1d', 'MaxPool2d', 'MaxPool3d', 'MaxUnpool1d', 'MaxUnpool2d',
        'MaxUnpool3d',
    )),
    ("torch.nn.modules.rnn", (
        'GRU', 'GRUCell', 'LSTM', 'LSTMCell', 'RNN', 'RNNBase', 'RNNCell', 'RNNCellBase',
    )),
    ("torch.nn.modules.sparse", (
        'Embedding', 'EmbeddingBag',
    )),
    ("torch.nn.modules.transformer", (
        'Transformer', 'TransformerDecoder', 'TransformerDecoderLayer', 'TransformerEncoder',
        'TransformerEncoderLayer',
    )),
    ("torch.nn.modules.upsampling", (
        'Upsample', 'UpsamplingBilinear2d', 'UpsamplingNearest2d',
    )),
    ("torch.nn.parallel.data_parallel", (
        'DataParallel',
    )),
)
_AO = "torch.ao quantization granularity or enum (torch/ao/quantization/observer.py): "

ENTRIES: tuple[Entry, ...] = (
    # torch.nn.utils.rnn: PackedSequence.__new__ (rnn.py) only checks and orders its four tensors
    # (_packed_sequence_init_args: isinstance checks, no I/O) and builds the namedtuple.
    Entry("torch.nn.utils.rnn", "PackedSequence", "inert", "a packed RNN batch (namedtuple of tensors): __new__ "
          "checks its arguments' types and builds the tuple", _T),
    Entry("torch.nn.utils.rnn", "PackedSequence_", "inert", "PackedSequence's namedtuple base (generated __new__)",
          _T),
    # torch.Generator pickles as (torch._C.Generator, (device,), state): a new generator on that device, then
    # __setstate__ sets *its own* state (seed, offset, state tensor); the global RNG is untouched.
    Entry("torch._C", "Generator", "inert", "a random generator: Generator(device) then __setstate__ of its own "
          "state (seed, offset, state bytes); the global RNG is untouched", _T),
    Entry("torch", "Generator", "inert", "torch.Generator is torch._C.Generator (see it)", _T),
    *(Entry("torch.distributed.fsdp.api", n, "inert", _FSDP + _ENUM, _T)
      for n in ("ShardingStrategy", "BackwardPrefetch", "StateDictType")),
    *(Entry("torch.distributed.fsdp.api", n, "inert", _FSDP + _DATACLASS, _T)
      for n in ("CPUOffload", "MixedPrecision", "StateDictConfig", "FullStateDictConfig", "LocalStateDictConfig",
                "ShardedStateDictConfig", "OptimStateDictConfig", "FullOptimStateDictConfig",
                "LocalOptimStateDictConfig", "ShardedOptimStateDictConfig", "StateDictSettings")),
    *(Entry("torch.distributed.fsdp", n, "inert", _FSDP2 + _DATACLASS, _T)
      for n in ("MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "DataParallelMeshDims")),
    *(Entry("torch.distributed.checkpoint.planner", n, "inert", _DCP + _DATACLASS, _T)
      for n in ("BytesIOWriteData", "LoadPlan", "ReadItem")),
    Entry("torch.distributed.checkpoint.planner", "LoadItemType", "inert", _DCP + _ENUM, _T),
    Entry("torch.distributed.checkpoint.state_dict", "StateDictOptions", "inert", _DCP + _DATACLASS, _T),
    Entry("torch.distributed.checkpoint.state_dict", "_StateDictInfo", "excluded", "get_state_dict's runtime "
          "bookkeeping, never saved by torch; it holds callables (fsdp_context) that would be judged anyway", _T),
    Entry("torch.distributed._shard.sharded_tensor.api", "ShardedTensor.ProcessGroupState", "inert",
          _DATACLASS + " (four ints: the saving rank and world; protocol 2 reaches it by "
          "getattr(ShardedTensor, 'ProcessGroupState'), judged as this name)", _T),
    Entry("torch.distributed.tensor.placement_types", "_StridedShardOffsetMode", "inert",
          "a DTensor placement mode: " + _ENUM, _T),
    Entry("torch.distributed.tensor.placement_types", "_MaskPartial", "excluded",
          "a transient placement of embedding lookups: its mask buffer is runtime state no saved DTensor carries, "
          "and Partial.__setstate__ is C++ (pybind11); not reviewed further", _T),
    *(Entry("torch.ao.quantization.observer", n, "inert", _AO + _DATACLASS, _T)
      for n in ("Granularity", "PerAxis", "PerBlock", "PerGroup", "PerRow", "PerTensor", "PerToken")),
    *(Entry("torch.ao.quantization.observer", n, "inert", _AO + _ENUM, _T)
      for n in ("MappingType", "TorchAODType", "ZeroPointDomain")),
    *(Entry("torch.ao.quantization.qconfig", n, "inert", "a quantization config (namedtuple of observer "
            "factories): __new__ only refuses module instances; its fields are judged as they are named", _T)
      for n in ("QConfig", "QConfigDynamic")),
    *(Entry("torch.return_types", n, "inert", "a structseq of tensors torch's private ops return (C type: "
            "__reduce__ gives (type, (fields,)), construction only stores them)", _T)
      for n in ("_fake_quantize_per_tensor_affine_cachemask_tensor_qparams", "_fused_moving_avg_obs_fq_helper",
                "_linalg_det", "_linalg_det_out", "_linalg_eigh", "_linalg_eigh_out", "_linalg_slogdet",
                "_linalg_slogdet_out", "_linalg_solve_ex", "_linalg_solve_ex_out", "_linalg_svd", "_linalg_svd_out",
                "_lu_with_info", "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                "_unpack_dual")),
    Entry("torch.amp.grad_scaler", "OptState", "inert", "GradScaler's per-optimizer stage: " + _ENUM, _T),
    Entry("torch.nn.modules.batchnorm", "_BatchNorm", "inert", _NN + " (also FSDP MixedPrecision's default "
          "_module_classes_to_ignore)", _T),
    Entry("torch.nn.modules.module", "Module", "inert", _NN, _T),
    Entry("torch.nn.modules.linear", "NonDynamicallyQuantizableLinear", "inert", _NN + " (MultiheadAttention's "
          "out_proj)", _T),
    Entry("torch.nn.modules.module", "_WrappedHook", "inert", "a module hook wrapper (lazy modules keep one): "
          "__setstate__ stores the hook and a weak reference to its module; the hook runs only when the module "
          "runs, and is judged as the global it names", _T),
    *(Entry("torch.nn.functional", n, "inert", "a torch activation function held as a module's attribute "
            "(Transformer layers' activation): pure tensor arithmetic when called, nothing at load", _T)
      for n in ("relu", "silu", "elu", "selu", "celu", "leaky_relu", "mish", "sigmoid", "tanh",
                "softmax", "log_softmax", "hardswish", "hardsigmoid", "relu6", "glu", "dropout")),
    *(Entry("torch._C._nn", n, "inert", "torch.nn.functional's C activation (how F.gelu and F.softplus pickle): "
            "pure tensor arithmetic when called, nothing at load", _T) for n in ("gelu", "softplus")),
    *(Entry("torch.nn.parameter", n, "excluded", "a lazy module's placeholder (see the Lazy modules): pickled as "
            "(cls, (requires_grad,)), an empty tensor of that class; ckpt does not read it as a tensor", _T)
      for n in ("UninitializedParameter", "UninitializedBuffer")),
    Entry("torch.utils.hooks", "RemovableHandle", "inert", "a hook handle (lazy modules keep one): __setstate__ "
          "keeps weak references to the dicts it is given and raises the class's next id; nothing runs", _T),
    *(Entry(m, n, "inert", _NN, _T) for m, names in NN_MODULES for n in names if not n.startswith("Lazy")),
    # Lazy modules pickle their load hook as a bound method, builtins.getattr(module, "_lazy_load_hook"), and
    # hold UninitializedParameters: getattr is judged by name, so a file holding one stays dangerous.
    *(Entry(m, n, "excluded", "a lazy module: its pickle reaches its load hook through builtins.getattr, which "
            "ckpt judges by name; materialise it (one forward pass) before saving", _T)
      for m, names in NN_MODULES for n in names if n.startswith("Lazy")),
)
