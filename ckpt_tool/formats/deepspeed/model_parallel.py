"""DeepSpeed model-parallel runs: pipeline stages joined, tensor-parallel ranks merged by rules.

``mp_rank_XX`` numbers the model-parallel ranks pipeline-major (rank
``i`` is stage ``i // tp``, tensor-parallel rank ``i % tp``, as DeepSpeed's
ds_to_universal reads them); ``checkpoint_parallel_dimensions`` in the model
states gives pp and tp. Each rank's ZeRO partitions are consolidated as for a
data-parallel run (read.py). A pipeline run keeps its weights in
``layer_XX[-model_YY]-model_states.pt``, one file per PipelineModule layer
holding that layer's own ``state_dict()`` (``weight``, ``bias``); ckpt names
them ``XX.weight`` with XX the global layer index (no zero padding), which is
what ``PipelineModule.state_dict()`` calls them (it registers layer XX as the
submodule ``str(XX)``) and what the model states' ``param_shapes`` and
``buffer_names`` already say. The stages are then joined in stage order and
the tensor-parallel ranks merged by the rules (formats/tp/): the user's rules
file first, else the run's ``universal_checkpoint_info``, else an error that
says what was found and what is missing.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ...errors import InputError
from ...format_names import DeepSpeedLayout, Format
from ...io import paths
from ...model import DataSource, GlobalRef, TensorMeta
from ...pickles.unpickle import LazyTensor
from ..checkpoint import summarize
from ..interface import Loaded, ReadOptions
from ..tp import UC_INFO, TpRules, from_universal_info, merge_ranks
from .files import ParallelRun
from .ranks import RankPart, StatesReader, consolidate


def parallel_sizes(m0: Mapping[Any, Any], par: ParallelRun) -> tuple[int, int]:
    """(pp, tp) as the model states record them; without the record, from the files."""
    dims = m0.get("checkpoint_parallel_dimensions")
    if isinstance(dims, Mapping):
        pp, tp = dims.get("pp_degree"), dims.get("tp_degree")
        if type(pp) is int and type(tp) is int and pp >= 1 and tp >= 1:
            return pp, tp
    if par.layers:
        tp = max(t for _, t, _ in par.layers) + 1
        return max(len(par.ranks) // tp, 1), tp
    return 1, len(par.ranks)


def _stage_layers(par: ParallelRun, models: list[dict[Any, Any]], pp: int, tp: int) -> list[list[tuple[int, str]]]:
    """Which layer files belong to each (stage, tp rank): a stage owns the layers its parameter names number."""
    owned: list[set[int]] = []
    for s in range(pp):
        m = models[s * tp]
        names = [str(n) for g in (m.get("param_shapes") or []) if isinstance(g, Mapping) for n in g]
        names += [str(n) for n in (m.get("buffer_names") or [])]
        names += [str(n) for n in (m.get("frozen_param_shapes") or {})]
        owned.append({int(n.split(".", 1)[0]) for n in names if n.split(".", 1)[0].isdigit()})
    firsts = [min(o) if o else None for o in owned]
    out: list[list[tuple[int, str]]] = [[] for _ in range(pp * tp)]
    for index, tp_rank, path in par.layers:
        if tp_rank >= tp:
            raise InputError(f"{paths.basename(path)} belongs to tensor-parallel rank {tp_rank}, but the run has "
                             f"tp={tp}", par.folder)
        stage = max((s for s, f in enumerate(firsts) if f is not None and f <= index), default=0)
        out[stage * tp + tp_rank].append((index, path))
    for s in range(pp):
        have = {i for i, _ in out[s * tp]}
        missing = sorted(owned[s] - have)
        if missing:
            raise InputError(f"layer_{missing[0]:02d}-...model_states.pt is missing: pipeline stage {s} names "
                             f"parameters of layer(s) {', '.join(map(str, missing[:5]))} but their layer files are "
                             f"not here (pp={pp}, tp={tp}; the save did not finish, or was not copied whole)",
                             par.folder)
    return out


def _names(m: Mapping[Any, Any]) -> set[str]:
    """Every tensor name a stage's model states record."""
    names = {str(n) for g in (m.get("param_shapes") or []) if isinstance(g, Mapping) for n in g}
    names |= {str(n) for n in (m.get("buffer_names") or [])}
    frozen = m.get("frozen_param_shapes")
    return names | {str(n) for n in (frozen if isinstance(frozen, Mapping) else ())}


def _module(files: list[tuple[int, str]], reader: StatesReader, names: set[str]) -> OrderedDict[str, LazyTensor]:
    """The stage's module state_dict from its layer files: ``N.key`` for key ``key`` of layer N.

    A TiedLayerSpec layer is registered once as ``tied_modules.<name>`` and saved into the layer file of
    every index it appears at; PipelineModule.state_dict() and param_shapes call it
    ``tied_modules.<name>.<key>``, so a layer file whose ``N.key`` the stage does not name, and whose key
    exactly one tied module of the stage has, is that tied module's copy (the first one kept).
    """
    module: OrderedDict[str, LazyTensor] = OrderedDict()
    tied = sorted(n for n in names if n.startswith("tied_modules."))
    for index, path in files:
        root = reader.pickle(path)
        for key, value in root.items():
            if not isinstance(value, LazyTensor):
                continue
            name = f"{index}.{key}"
            if name not in names:
                owners = [n for n in tied if n.split(".", 2)[2:] == [str(key)]]
                if len(owners) == 1:
                    if owners[0] not in module:
                        module[owners[0]] = value
                    continue
            module[name] = value
    return module


def _rules(options: ReadOptions, m0: Mapping[Any, Any], pp: int, tp: int, path: str) -> TpRules:
    if options.tp_rules is not None:
        return options.tp_rules
    info = m0.get(UC_INFO)
    if isinstance(info, Mapping):
        return from_universal_info(info, path)
    raise InputError(f"a tensor-parallel DeepSpeed checkpoint (pp={pp}, tp={tp}): its model states record no "
                     f"{UC_INFO}, so how each tensor was split is unknown; give the split dimension of each key in "
                     "a rules file, --tp-rules rules.toml (inspect, diff, gate and migrate take it; "
                     "docs/consolidate.md)", path)


def read_parallel(path: str, par: ParallelRun, options: ReadOptions) -> Loaded:
    """Every model-parallel rank consolidated, the stages joined and the tensor-parallel ranks merged."""
    if paths.is_url(par.folder):
        paths.open_together([p for r in par.ranks for _, p in r.model + r.optim] + [p for *_, p in par.layers])
    states = StatesReader(par.ranks[0], options)  # the model states and layer files of every rank
    m0 = states.pickle(par.ranks[0].model[0][1])
    pp, tp = parallel_sizes(m0, par)
    if pp * tp != len(par.ranks):
        raise InputError(f"the model states say pp={pp} x tp={tp} ({pp * tp} model-parallel rank(s)), but "
                         f"{len(par.ranks)} mp_rank_XX model-states files are here: the checkpoint is incomplete, "
                         "or two runs share the folder", par.folder)
    rules = _rules(options, m0, pp, tp, path) if tp > 1 else None
    models = [m0] + [states.pickle(r.model[0][1]) for r in par.ranks[1:]]
    layers = _stage_layers(par, models, pp, tp) if par.layers else None
    if pp > 1 and layers is None:
        raise InputError(f"a pipeline-parallel DeepSpeed checkpoint (pp={pp}, tp={tp}) without its layer_XX-"
                         "model_states.pt files: the weights are in them", par.folder)
    parts: list[RankPart] = []
    for i, run in enumerate(par.ranks):
        module = _module(layers[i], states, _names(models[i])) if layers is not None else None
        parts.append(consolidate(run, options, models[i], module))
    readers = [states] + [p.reader for p in parts]
    references: list[GlobalRef] = [ref for r in readers for ref in r.references]
    warnings: list[str] = list(dict.fromkeys(w for r in readers for w in r.warnings))
    sources: list[DataSource] = [p.builder.source for p in parts] + [s for r in readers for s in r.sources]
    tensors: OrderedDict[str, TensorMeta] = OrderedDict()
    merges: dict[str, int] = {}
    for s in range(pp):
        stage = [parts[s * tp + t].tensors for t in range(tp)]
        if rules is not None:
            merged, more, counts = merge_ranks(stage, rules, par.folder, (pp, tp))
            sources += more
            for name, n in counts.items():
                merges[name] = merges.get(name, 0) + n
        else:
            merged = stage[0]
        repeated = [k for k in merged if k in tensors]
        if repeated:
            warnings.append(f"tied weight(s) {', '.join(repeated[:3])} are held by more than one pipeline stage "
                            "(DeepSpeed keeps the copies equal); the first stage's are written")
        for key, meta in merged.items():
            tensors.setdefault(key, meta)
    from .meta import describe

    p0 = parts[0]
    metadata = describe(par.ranks[0], m0, p0.optim, p0.stage, p0.world, list(tensors.values()))
    info = metadata["deepspeed"]
    info["layout"] = str(DeepSpeedLayout.PIPELINE if pp > 1 else DeepSpeedLayout.TENSOR_PARALLEL)
    info.update(pp=pp, tp=tp, files=[paths.basename(p) for r in par.ranks for _, p in r.model + r.optim]
                + [paths.basename(p) for *_, p in par.layers])
    if rules is not None:
        info["tp_rules"] = {"from": rules.origin, "merged": merges}
    if m0.get(UC_INFO) is not None:
        metadata[UC_INFO] = summarize(m0[UC_INFO])
    return Loaded(Format.DEEPSPEED, tensors, tuple(references), tuple(warnings), tuple(sources), layout="state_dict",
                  metadata=metadata, framework="deepspeed", tensors=tuple(tensors.values()))
