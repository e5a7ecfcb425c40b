"""The shape of migrate's output besides its tensors: the pickled container, or the stored tensors and metadata.

One shaper per output format (``SHAPERS``), each run before a byte is
written: what a format cannot hold (tensors inside other objects in a flat
safetensors mapping, placeholders a target would be handed, dangerous
references) is refused here.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...errors import UsageError
from ...format_names import OutputFormat
from ...keys.rules import RuleSet
from ...model import Checkpoint
from ...pickles.unpickle.placeholders import Placeholder
from ...writers.base import OutTensor
from ...writers.layout import dedupe, entries_holding_tensors, safetensors_metadata, torch_root
from ...writers.payload import Payload, SafetensorsPayload, TorchPayload
from .plan import MigratePlan

if TYPE_CHECKING:
    from ...tensors.target import Target


def refuse_opaque(built: Target, chosen: object, rules: RuleSet) -> None:
    """A target cannot be handed the placeholders of its extra state: refuse before writing."""
    if not built.extra_state or not isinstance(chosen, Mapping):
        return
    opaque = [k for k, v in chosen.items() if isinstance(v, Placeholder) and rules.new_key(str(k))
              in built.extra_state]
    if opaque:
        raise UsageError(f"--target cannot load {', '.join(map(repr, opaque[:3]))}: "
                         f"{chosen[opaque[0]].qualname} "
                         "objects are read as inert placeholders and never rebuilt (ckpt runs no code from "
                         "the file), so the target check cannot hand them to the module; migrate without "
                         "--target, and load the output with torch.load(weights_only=False) only if you "
                         "trust the file")


@dataclass(frozen=True, kw_only=True)
class Shaped:
    """The output's container besides its tensors, and what shaping it kept, converted and warned."""

    payload: Payload
    metadata_kept: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    sanitized: tuple[str, ...] | None = None
    warnings: tuple[str, ...] = ()


def _refuse_held(ck: Checkpoint, plan: MigratePlan, chosen: object) -> None:
    """A flat mapping of tensors cannot hold the tensors inside other objects: never dropped silently."""
    held = [k for k in entries_holding_tensors(chosen, ck.keys) if plan.rules.new_key(k) is not None]
    if held:  # they are tensors of the source too
        raise UsageError(f"a {plan.output.format} output holds a flat mapping of tensors; these state_dict entries "
                         f"hold tensors inside another object and would be lost: {', '.join(map(repr, held[:5]))}"
                         f"{' ...' if len(held) > 5 else ''}; write a .pth, or leave them out with --drop")


def _shape_torch(ck: Checkpoint, plan: MigratePlan, chosen: object, tensors: Sequence[OutTensor]) -> Shaped:
    """The pickled container of a torch output: metadata kept, placeholders written back or sanitized."""
    from ...writers.torchsave.archive import pickle_root
    from ...writers.torchsave.inert import refuse_unwritable

    root, sd_key, kept, warnings = torch_root(ck, chosen, tensors, plan.rules, plan.output.state_dict_only)
    refuse_unwritable(root, plan.source.path, sd_key)  # dangerous references are never written back, not even sanitized
    sanitized = None
    if plan.output.sanitize:
        from ...pickles.torch_rules.predict import rules_for
        from ...writers.torchsave.sanitize import sanitize as sanitize_tree

        root, conversions = sanitize_tree(root, rules_for(None).allowed)
        if ck.layout in ("module", "torchscript"):  # the biggest conversion of all: say it, not "already plain"
            what = "a pickled nn.Module" if ck.layout == "module" else "a TorchScript archive"
            conversions = [f"(the file): {what} -> its state_dict (load it with model.load_state_dict)",
                           *conversions]
        sanitized = tuple(conversions)
    data_pkl, table = pickle_root(root)
    return Shaped(payload=TorchPayload(data_pkl=data_pkl, table=table, root=root, sd_key=sd_key),
                  metadata_kept=tuple(kept), sanitized=sanitized, warnings=tuple(warnings))


def _shape_safetensors(ck: Checkpoint, plan: MigratePlan, chosen: object, tensors: Sequence[OutTensor]) -> Shaped:
    """Each tensor stored once (ties as aliases) and the string metadata of a safetensors file or set."""
    from ...writers.safetensors.single import check_dtypes

    _refuse_held(ck, plan, chosen)
    stored, aliases, warnings = dedupe(tensors)
    meta, kept, more = safetensors_metadata(ck, chosen, plan.output.state_dict_only)
    warnings += more
    clash = sorted(a for a in aliases if a in meta)
    if clash:
        warnings.append(f"metadata entries replaced by tie records: {', '.join(clash[:5])}")
    check_dtypes(stored)
    return Shaped(payload=SafetensorsPayload(stored=tuple(stored), aliases=aliases, meta=meta),
                  metadata_kept=tuple(kept), aliases=aliases, warnings=tuple(warnings))


def _shape_hf(ck: Checkpoint, plan: MigratePlan, chosen: object, tensors: Sequence[OutTensor]) -> Shaped:
    """A Hugging Face folder's weights are a safetensors file or set; say what from_pretrained will lack."""
    from dataclasses import replace

    shaped = _shape_safetensors(ck, plan, chosen, tensors)
    hf = plan.output.hf
    more: list[str] = []
    configs = ("config.json", "adapter_config.json", f"{hf.weights_dir}/config.json") if hf is not None else ()
    if hf is not None and not any(c in hf.files for c in configs):
        more.append("the output folder gets no config.json, which from_pretrained needs"
                    + (f" ({hf.copy_from} holds none)" if hf.copy_from else "")
                    + ": --config-from DIR copies a model's config and tokenizer files"
                    + (f" (e.g. --config-from {hf.hint})" if hf.hint else ""))
    if hf is not None:
        pickled = [f for f in hf.files if f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
        if pickled:
            more.append(f"copied as they are, not migrated: {', '.join(pickled[:5])} (another module's pickled "
                        "weights: `ckpt scan` them before loading)")
    return replace(shaped, warnings=shaped.warnings + tuple(more))


def _shape_dcp(ck: Checkpoint, plan: MigratePlan, chosen: object, tensors: Sequence[OutTensor]) -> Shaped:
    """A DCP folder holds the state_dict only."""
    from ...writers.dcp import check_dtypes

    _refuse_held(ck, plan, chosen)
    check_dtypes(tensors)
    if not plan.output.state_dict_only and ck.layout == "container":
        return Shaped(payload=None,
                      warnings=("a DCP output holds the state_dict only; the other entries were not kept",))
    return Shaped(payload=None)


SHAPERS: Mapping[OutputFormat, Callable[[Checkpoint, MigratePlan, object, Sequence[OutTensor]], Shaped]] = {
    OutputFormat.TORCH_ZIP: _shape_torch,
    OutputFormat.SAFETENSORS: _shape_safetensors,
    OutputFormat.SHARDED: _shape_safetensors,
    OutputFormat.DCP: _shape_dcp,
    OutputFormat.HF_FOLDER: _shape_hf,
}
