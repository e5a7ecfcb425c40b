"""Text rendering of a MigrateReport (JSON is MigrateReport.to_json)."""
from __future__ import annotations

from ..commands.migrate import MigrateReport
from .common import human_bytes, shape_str, simple_table

_SHOWN = 12
_PLAN_ROWS = 2000  # a dry run of a 200,000-tensor file prints this many rows; --json lists them all


def _sample(items: list[str], n: int = _SHOWN) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def plan_table(report: MigrateReport) -> str:
    """One row per source tensor: old key -> new key, dtype change, or dropped."""
    rows = []
    entries = report.plan.entries
    for e in entries[:_PLAN_ROWS]:
        if e.output is None:
            rows.append([e.source, "(dropped)", e.dtype])
        else:
            dtype = f"{e.dtype} -> {e.cast}" if e.cast else e.dtype
            rows.append([e.source, e.output if e.output != e.source else "=", dtype])
    table = simple_table(rows, ["source key", "output key", "dtype"])
    if len(entries) > _PLAN_ROWS:
        table += f"\n... and {len(entries) - _PLAN_ROWS} more (--json lists every key)"
    return table


def target_lines(report: MigrateReport) -> list[str]:
    check = report.target
    if check is None:
        return []
    if check.ok:
        if check.allowed_missing:
            return [f"target:   {check.spec}: keys and shapes match, except the allowed missing "
                    f"{_sample(list(check.allowed_missing))}"]
        return [f"target:   {check.spec}: every key and shape matches"]
    lines = [f"target:   {check.spec}: the output would NOT load with strict=True"
             + ("" if report.dry_run else "; nothing was written")]
    if check.missing:
        lines.append(f"  missing (the target has them, the output does not): {_sample(list(check.missing))}")
    if check.unexpected:
        lines.append(f"  unexpected (the output has them, the target does not): {_sample(list(check.unexpected))}")
    for key, a, b in check.shape_mismatch[:_SHOWN]:
        lines.append(f"  shape mismatch: {key}: output {shape_str(a)}, target {shape_str(b)}")
    if check.missing and not check.unexpected and not check.shape_mismatch:
        heads = sorted({k.rsplit(".", 1)[0] + ".*" if "." in k else k for k in check.missing})
        lines.append("  if the model initialises these itself (a new head or layer), allow them: "
                     + " ".join(f"--allow-missing '{h}'" for h in heads[:4]))
    else:
        lines.append("  fix the rules (see `ckpt diff SRC --target SPEC`), or drop --target to write anyway")
    return lines


def verification_line(report: MigrateReport) -> str:
    if not report.verified:
        return "verified: NO (--no-verify)"
    parts = [f"{dev} {state}" for dev, state in report.device_status.items()]
    checks = list(report.checks) or ["bit-for-bit re-read"]
    if report.target is not None:
        checks.append("load_state_dict into the target" + (
            " (strict but for --allow-missing)" if report.target.allowed_missing else " (strict=True)"))
    return f"verified: {', '.join(parts)} ({'; '.join(checks)})"


def cast_line(report: MigrateReport) -> str | None:
    casts = [e for e in report.plan.entries if e.cast and e.output]
    if not casts:
        return None
    to = sorted({e.cast for e in casts if e.cast})
    line = f"cast:     {len(casts)} tensor(s) to {', '.join(to)}"
    if report.cast_loss:
        bad = sum(c.loss.overflowed for c in report.cast_loss)
        flushed = sum(c.loss.flushed for c in report.cast_loss)
        if bad:
            line += f"; {bad} value(s) became inf/NaN or were clamped"
            line += " (accepted: --allow-overflow)" if report.overflow_allowed else ""
        else:
            line += "; no value became inf/NaN or was clamped"
        line += f", {flushed} nonzero value(s) became 0" if flushed else ", none flushed to zero"
    return line


def migrate_text(report: MigrateReport) -> str:
    out = _plan_lines(report) + _beside_lines(report) + target_lines(report) + _outcome_lines(report)
    if report.warnings:
        out.append("warnings:")
        out.extend(f"  - {w}" for w in report.warnings)
    return "\n".join(out)


def _plan_lines(report: MigrateReport) -> list[str]:
    """Source, output, rules and what they do to the keys and tensors."""
    out = [f"source:   {report.source} ({report.source_format})",
           f"output:   {report.output or '-'} ({report.format})"
           + ("  [dry run: nothing written]" if report.dry_run else "")]
    if report.inferred is not None:
        out.append(f"inferred: {report.inferred.describe()}")
    rules = report.rules.describe()
    if report.source_options:  # how the source was read (tensor-parallel rules, unstacked layers)
        read = " ".join(report.source_options)
        keyless = not report.rules.cli_args() and not report.rules.casts
        rules = f"{read} (no key rules)" if keyless else f"{rules} {read}"
    out.append(f"rules:    {rules}")
    renamed = report.plan.renamed
    if renamed:
        out.append(f"renamed:  {len(renamed)} key(s), e.g. " + "; ".join(f"{a} -> {b}" for a, b in renamed[:3]))
    dropped = report.plan.dropped
    if dropped:
        out.append(f"dropped:  {len(dropped)}: {_sample(dropped)}")
    line = cast_line(report)
    if line is not None:
        out.append(line)
    total = sum(t.nbytes for t in report.tensors)
    out.append(f"tensors:  {len(report.tensors)} ({human_bytes(total)})"
               + (f", {len(report.aliases)} tied (stored once)" if report.aliases else ""))
    return out


def _beside_lines(report: MigrateReport) -> list[str]:
    """What the output holds beside the tensors: shards, metadata, copied files, sanitized objects."""
    out = []
    if report.shards:
        out.append(f"shards:   {len(report.shards)}")
    if report.metadata_kept:
        out.append(f"metadata: kept {_sample(list(report.metadata_kept))}")
    if report.copied:
        out.append(f"copied:   {len(report.copied)} file(s) beside the weights: {_sample(list(report.copied))}")
    if report.left_out:
        by_why: dict[str, list[str]] = {}
        for f, why in report.left_out:
            by_why.setdefault(why, []).append(f)
        out.append("left out: " + "; ".join(f"{_sample(files, 6)} ({why})" for why, files in by_why.items()))
    if report.sanitized is not None:
        out.append(f"sanitized: {len(report.sanitized)} conversion(s) for torch.load(weights_only=True)"
                   + (":" if report.sanitized else " (the metadata was already plain)"))
        out.extend(f"  {c}" for c in report.sanitized[:40])
        if len(report.sanitized) > 40:
            out.append(f"  ... and {len(report.sanitized) - 40} more (--json lists them all)")
    return out


def _outcome_lines(report: MigrateReport) -> list[str]:
    """The plan of a dry run, or what became of the output: failed, or verified and written."""
    if report.dry_run:
        return ["", plan_table(report)]
    if report.failures and any(c.loss.overflowed for c in report.cast_loss) and not report.overflow_allowed:
        return ["CAST FAILED: values became inf/NaN or were clamped; nothing was written "
                "(an existing output was left as it was)"] + [f"  - {f}" for f in report.failures]
    if report.failures:
        return (["VERIFICATION FAILED: the output was removed (an existing output was left as it was)"]
                + [f"  - {f}" for f in report.failures])
    if not report.written:
        return []
    out = [verification_line(report)]
    if report.weights_only_load is not None:
        out.append(f"weights_only: torch.load(weights_only=True) in a fresh process: {report.weights_only_load}")
    out.append(f"wrote:    {report.output} ({human_bytes(report.bytes_written)})")
    return out
