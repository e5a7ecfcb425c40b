"""Text and JSON rendering of an InspectReport."""
from __future__ import annotations

import json
import sys
import uuid
from json.encoder import encode_basestring_ascii as _quote
from operator import attrgetter
from typing import Any

from ..commands.inspect import DeepSpeedRun, InspectReport, MegatronCore, SourceFacts, subclass_json
from ..format_names import Format
from ..model import Checkpoint
from .common import dumps, human_bytes, human_count, shape_str, simple_columns


def json_text(report: InspectReport) -> str:
    """``dumps(report.to_json())``, with the tensor list written row by row.

    json.dumps of 200,000 small dicts takes 0.8 s here; each row is instead
    formatted from C-encoded strings and cached shape lists, giving the same
    compact document. At a terminal (indented JSON) and with --stats the
    plain path runs.
    """
    if report.stats is not None or sys.stdout.isatty():
        return dumps(report.to_json())
    doc = report.to_json(tensors=False)
    marker = f"ckpt-tensors-{uuid.uuid4().hex}"  # a string no checkpoint can hold by chance
    doc["tensors"] = marker
    return dumps(doc).replace(f'"{marker}"', _tensor_rows(report), 1)


def _tensor_rows(report: InspectReport) -> str:
    notes = report.notes
    lists: dict[Any, str] = {}
    words: dict[str, str] = {}

    def as_list(values: tuple[int, ...]) -> str:
        found = lists.get(values)
        if found is None:
            found = lists[values] = json.dumps(list(values))
        return found

    def word(text: str) -> str:
        found = words.get(text)
        if found is None:
            found = words[text] = _quote(text)
        return found

    rows = []
    for t in report.checkpoint.tensors:
        note = notes.get(t.key)
        rows.append(
            f'{{"key": {_quote(t.key)}, "dtype": {word(t.dtype)}, "shape": {as_list(t.shape)}, '
            f'"numel": {t.numel}, "nbytes": {"null" if t.nbytes is None else t.nbytes}, '
            f'"stride": {as_list(t.strides)}, "storage_offset": {t.storage_offset}, '
            f'"device": {word(t.device)}, "notes": {json.dumps(list(note)) if note else "[]"}'
            + (f', "subclass": {json.dumps(subclass_json(t.subclass))}}}' if t.subclass is not None else "}")
        )
    return "[" + ", ".join(rows) + "]"


def summary_lines(report: InspectReport) -> list[str]:
    c = report.checkpoint
    facts = report.facts
    lines = [f"path:       {c.path}"]
    fmt = c.format + (f" ({facts.sharded.shard_format} shards: {facts.sharded.shards})"
                      if facts.sharded is not None else "")
    lines.append(f"format:     {fmt}" + ("  (TorchScript archive)" if c.format == Format.TORCHSCRIPT else ""))
    layout = c.layout
    if c.framework:
        layout += f", {c.framework}"
    lines.append(f"layout:     {layout}")
    lines += _training_lines(facts)
    from .hf_folder import folder_lines

    lines.extend(folder_lines(c.metadata))  # a library's folder: who wrote it, what config.json says
    return lines + _contents_lines(report)


def _where_lines(c: Checkpoint) -> list[str]:
    """Where in the container the state_dict was found, and the other groups of tensors beside it."""
    lines = []
    if c.state_dict_key is not None:
        where = repr(c.state_dict_key) if c.state_dict_key else "top level"
        lines.append(f"state_dict: {where}")
    others = [x for x in c.candidates if not x.chosen]
    if others:
        groups = ", ".join(f"{x.key or '<top>'} ({x.tensors})" for x in others[:6])
        lines.append("            other tensor groups: " + groups)
    return lines


def _contents_lines(report: InspectReport) -> list[str]:
    """Where the state_dict is, what it holds, the other metadata and the weights_only prediction."""
    c = report.checkpoint
    lines = _where_lines(c)
    lines.append(
        f"tensors:    {len(c.tensors)}   parameters: {human_count(c.total_numel)} ({c.total_numel:,})"
        f"   size: {human_bytes(c.total_nbytes)}"
    )
    if report.dtype_counts:
        lines.append("dtypes:     " + ", ".join(f"{k} x{v}" for k, v in report.dtype_counts.items()))
    if report.quantization is not None:
        lines.append("quantized:  " + report.quantization.describe())
    if report.prefixes:
        lines.append("prefixes:   " + ", ".join(report.prefixes))
    if c.metadata:
        keys = sorted(str(k) for k in c.metadata)
        lines.append("metadata:   " + ", ".join(keys[:12]) + (" ..." if len(keys) > 12 else ""))
    unread = report.not_read
    if unread:
        size = sum(d.nbytes for _, d in unread)
        lines.append(f"            {len(unread)} value(s) not read ({unread[0][1].kind}s, {human_bytes(size)}): "
                     "migrate and diff --values read them, `ckpt scan` checks their pickles")
    if report.weights_only is not None:
        first, *rest = report.weights_only.lines()
        lines.append(f"weights_only: {first}")
        lines.extend(f"            {line}" for line in rest)
    return lines


def _training_lines(facts: SourceFacts) -> list[str]:
    """The run a checkpoint comes from: DeepSpeed, Megatron-LM or -core, a distributed safetensors writer."""
    lines = []
    if facts.deepspeed is not None:  # what was consolidated: the run the partitions come from
        lines.append(_deepspeed_line(facts.deepspeed))
    if facts.megatron_legacy is not None:  # Megatron-LM's mp_rank_XX folders
        meg = facts.megatron_legacy
        how = f", merged by {meg.merged_by}" if meg.merged else ""
        lines.append(f"training:   Megatron-LM legacy checkpoint, iteration {meg.iteration}, "
                     f"pp={meg.pp} tp={meg.tp}{how}")
    elif facts.megatron_core is not None:  # Megatron-core torch_dist: what metadata.json and common.pt say
        lines.append(_megatron_core_line(facts.megatron_core))
    dist = facts.distributed
    if dist is not None:
        lines.append(f"training:   torch.distributed.checkpoint HuggingFaceStorageWriter(save_distributed=True), "
                     f"{dist.ranks} rank(s), {dist.files} file(s), {dist.slices} slices")
    return lines


def _deepspeed_line(ds: DeepSpeedRun) -> str:
    kind = "universal checkpoint" if ds.universal else f"ZeRO-{ds.zero_stage}"
    parallel = ""
    if ds.parallel is not None:
        pp, tp = ds.parallel
        parallel = f", {'merged from' if ds.universal else ds.layout} pp={pp} tp={tp}"
    experts = (f", MoE {len(ds.experts)} layer(s) x {'/'.join(map(str, ds.experts))} experts "
               f"({ds.expert_files} expert files)" if ds.experts else "")
    return (f"training:   DeepSpeed {kind}, {ds.world_size} rank(s){parallel}, {ds.dtype}{experts}, tag {ds.tag} "
            f"(DeepSpeed {ds.version})")


def _megatron_core_line(meg: MegatronCore) -> str:
    common = "none" if meg.common_keys is None else ", ".join(meg.common_keys[:8]) or "empty"
    saved = "" if meg.saved_with is None else "; saved with " + " ".join(f"{k}={v}" for k, v in meg.saved_with)
    return (f"training:   Megatron-core {meg.backend} v{meg.backend_version}; layers "
            f"{'unstacked' if meg.unstacked else 'stacked'} ({meg.stacked_layers}); common.pt: {common}{saved}")


def render_table(report: InspectReport) -> str:
    stats = report.stats
    if stats is None:
        return _plain_table(report)
    rows = []
    for t in report.checkpoint.tensors:
        row = [t.key, t.dtype, shape_str(t.shape), f"{t.numel:,}", human_bytes(t.nbytes)]
        if stats is not None:
            s = stats.get(t.key)
            if s is None or s.min is None:
                row += ["", "", "", "", str(s.nan) if s else "", str(s.inf) if s else ""]
            else:
                row += [f"{s.min:.4g}", f"{s.max:.4g}", f"{s.mean:.4g}", f"{s.std:.4g}", str(s.nan), str(s.inf)]
        row.append("; ".join(report.notes.get(t.key, ())))
        rows.append(row)
    headers = ["key", "dtype", "shape", "numel", "bytes"]
    if stats is not None:
        headers += ["min", "max", "mean", "std", "nan", "inf"]
    headers.append("notes")
    from tabulate import tabulate

    return str(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))


def _plain_table(report: InspectReport) -> str:
    """The table without stats, built column by column with C-speed maps (200,000 rows in ~0.3 s).

    Shapes, element counts and sizes repeat: each distinct value is
    formatted once and looked up for every row.
    """
    tensors = report.checkpoint.tensors
    notes = report.notes
    shapes = list(map(_SHAPE, tensors))
    numels = list(map(_NUMEL, tensors))
    sizes = list(map(_NBYTES, tensors))
    shape_text = {s: shape_str(s) for s in set(shapes)}
    numel_text = {n: f"{n:,}" for n in set(numels)}
    size_text = {n: human_bytes(n) for n in set(sizes)}
    keys = list(map(_KEY, tensors))
    note_col = [""] * len(keys)
    if notes:
        for i, key in enumerate(keys):
            note = notes.get(key)
            if note:
                note_col[i] = "; ".join(note)
    columns = [keys, list(map(_DTYPE, tensors)), list(map(shape_text.__getitem__, shapes)),
               list(map(numel_text.__getitem__, numels)), list(map(size_text.__getitem__, sizes)), note_col]
    return simple_columns(columns, ["key", "dtype", "shape", "numel", "bytes", "notes"])


_KEY, _DTYPE, _SHAPE, _NUMEL, _NBYTES = (attrgetter(n) for n in ("key", "dtype", "shape", "numel", "nbytes"))


def render_tree(report: InspectReport) -> str:
    """Module paths with parameter counts, indented by depth."""
    totals: dict[tuple[str, ...], int] = {}
    counts: dict[tuple[str, ...], int] = {}
    for t in report.checkpoint.tensors:
        parts = tuple(t.key.split("."))
        for i in range(1, len(parts)):
            totals[parts[:i]] = totals.get(parts[:i], 0) + t.numel
            counts[parts[:i]] = counts.get(parts[:i], 0) + 1
    rows = []
    seen: set[tuple[str, ...]] = set()
    for t in report.checkpoint.tensors:
        parts = tuple(t.key.split("."))
        for i in range(1, len(parts)):
            node = parts[:i]
            if node in seen:
                continue
            seen.add(node)
            rows.append(f"{'  ' * (i - 1)}{node[-1]}  {human_count(totals[node])} params, {counts[node]} tensors")
        rows.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}  {t.dtype} {shape_str(t.shape)}")
    return "\n".join(rows)


def inspect_text(report: InspectReport, *, tree: bool = False) -> str:
    out = summary_lines(report)
    if report.warnings:
        out.append("warnings:")
        out.extend(f"  - {w}" for w in report.warnings)
    out.append("")
    out.append(render_tree(report) if tree else render_table(report))
    return "\n".join(out)
