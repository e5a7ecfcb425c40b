"""The gate's checks of how the file loads: statically (``loads-safely``, the scan) and by torch.load
(``weights-only``, torch's weights_only rules replayed). ``--allow-global`` lifts a class from both,
never a global that runs code (``severity.allowable``); checks.py lifts it from the strict warnings.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...format_names import Format
from ...limits import Limits
from ...model import Checkpoint
from ...pickles import severity
from .checks import Check, listing, skipped
from .names import CheckName
from .policy import Policy

if TYPE_CHECKING:  # imported when the check runs (commands/loads_check is not needed by the others)
    from ..loads_check import WeightsOnlyReport


def check_loads_safely(path: str, pol: Policy, limits: Limits) -> Check:
    return loads_safely(path, pol, limits).check


@dataclass(frozen=True)
class SafetyVerdict:
    """The loads_safely check, and what decides the gate's exit code: a call found, or bytes left unread."""

    check: Check
    dangerous: bool  # a call or construction that can run code: the gate fails (exit 1) even if unreadable
    unread: str | None  # what could not be scanned (a folder, a file, a broken part), else None: exit 2


def loads_safely(path: str, pol: Policy, limits: Limits) -> SafetyVerdict:
    """Scan ``path`` as ``ckpt scan`` does: dangerous names first, then what could not be read."""
    from ...errors import CkptError
    from ...formats import SourceOptions
    from ..scan import ScanOptions, scan_paths

    try:
        report = scan_paths([path], SourceOptions(limits=limits),
                            ScanOptions(strict=pol.strict, allow_globals=pol.weights_only_allow))
    except CkptError as exc:  # nothing to scan at all (a folder holding no checkpoint data)
        return SafetyVerdict(Check(CheckName.LOADS_SAFELY, False, f"could not be scanned: {exc.message}"), False,
                             exc.message)
    dangerous: list[str] = []
    suspicious: list[str] = []
    errors: list[str] = []
    pickles = 0
    for f in report.files:
        pickles += f.pickles
        errors.extend(f.errors)
        for g in f.globals:
            item = f"{g.qualname} ({g.where})" if g.where else g.qualname
            (dangerous if g.severity == severity.DANGEROUS else suspicious
             if g.severity == severity.SUSPICIOUS else []).append(item)
        for x in f.findings:
            (dangerous if x.severity == severity.DANGEROUS else suspicious).append(x.message)
    unread = listing(errors, 2) if errors else None
    also = f"; also could not be read: {unread}" if unread else ""
    if dangerous:
        return SafetyVerdict(Check(CheckName.LOADS_SAFELY, False, "dangerous references (never executed): "
                                   + listing(dangerous) + also), True, unread)
    if errors:
        return SafetyVerdict(Check(CheckName.LOADS_SAFELY, False, f"could not be scanned completely: {unread}"), False,
                             unread)
    if suspicious:
        text = ("globals the pickle names but never calls or constructs (not on the inert allowlist): "
                + listing(sorted(set(suspicious))))
        return SafetyVerdict(Check(CheckName.LOADS_SAFELY, not pol.strict, text + ("" if pol.strict else
                                   " (fails with --strict)"), warning=not pol.strict), False, None)
    return SafetyVerdict(Check(CheckName.LOADS_SAFELY, True, f"no dangerous references ({pickles} pickle(s) scanned)"),
                         False, None)


def check_weights_only(ckpt: Checkpoint, pol: Policy) -> Check:
    """Fails when the deployment's default torch.load (weights_only=True since 2.6) would refuse the file.

    Globals the policy allows (``weights_only_allow``, ``--allow-global``)
    count as allowlisted by the loader; a global that can run code never does.
    """
    name = CheckName.WEIGHTS_ONLY
    if not pol.weights_only_check:
        return skipped(name, "--no-weights-only-check")
    from ..loads_check import assess

    wo = assess(ckpt, pol.weights_only_torch)
    if wo is None:
        return skipped(name, "nothing to predict from (the file was not read by ckpt's own readers)")
    if wo.files:
        return _weights_only_files(wo, pol)
    if not wo.applies:
        return skipped(name, wo.reason or "torch.load does not read this input")
    rules = f"torch {wo.torch}"
    if wo.loads:
        return Check(name, True, f"torch.load(weights_only=True) loads it ({rules} rules)")
    if Format.SAFETENSORS in (ckpt.format, ckpt.metadata.get("shard_format")):
        return skipped(name, "safetensors holds no pickle: it is loaded with safetensors, not torch.load")
    if not wo.default_weights_only:
        return Check(name, True, f"{rules}'s torch.load defaults to weights_only=False, so its default load does "
                                 f"not refuse it; with weights_only=True: {wo.headline()}")
    if wo.dangerous:
        return Check(name, False, wo.headline() + " (the policy cannot allow it)")
    if wo.reason is not None:
        fix = wo.sanitize_command
        return Check(name, False, wo.headline() + (f". Convert it: {fix}" if fix else ""))
    missing = [n for n in wo.needs if n not in pol.weights_only_allow]
    if not missing:
        how = f": {wo.fix}" if wo.fix else _main_note(wo.needs)
        return Check(name, True, f"loads with the allowed globals {listing(list(wo.needs))} ({rules} rules); the "
                                 "loading code must allowlist them" + how)
    ways = [f"allowlist them where it is loaded ({wo.fix}) and in the policy (weights_only_allow / --allow-global)"
            if wo.fix else "allowlist them where it is loaded and in the policy (weights_only_allow / "
            "--allow-global)" + _main_note(missing)]
    if wo.extract_command:
        ways.append(f"extract its weights: {wo.extract_command}")
    if wo.sanitize_command:
        ways.append(f"convert it: {wo.sanitize_command}")
    return Check(name, False, f"torch.load(weights_only=True) refuses it ({rules} rules): needs "
                              f"{listing(missing, 8)}. " + "; or ".join(ways)[:1].upper() + "; or ".join(ways)[1:])


def _main_note(needs: Sequence[str]) -> str:
    """``__main__`` classes: only the script that saved the file can import them (no allowlist line elsewhere)."""
    main = [n for n in needs if n.startswith("__main__.")]
    if not main:
        return ""
    return f" ({', '.join(main)} lived in the saving script's __main__: only that script can import them)"


def _weights_only_files(wo: WeightsOnlyReport, pol: Policy) -> Check:
    """A folder: torch.load opens none of it; the files its loader hands to torch.load must each load."""
    name = CheckName.WEIGHTS_ONLY
    opened = wo.torch_loaded
    if not opened:
        loaders = sorted({f.loader for f in wo.files})
        return skipped(name, f"{wo.reason}; this check judges files a loader opens with the default "
                           f"torch.load(weights_only=True), and its files are read by {', '.join(loaders)} with "
                           "their own settings (inspect lists each file's verdict)")
    refused = [f for f in opened if not f.loads and (f.reason is not None or f.dangerous
                                                    or not set(f.needs) <= set(pol.weights_only_allow))]
    rules = f"torch {wo.torch} rules"
    if not refused:
        allowed = sorted({n for f in opened for n in f.needs})
        extra = f" with the allowed globals {listing(allowed)}" if allowed else ""
        return Check(name, True, f"each of the {len(opened)} file(s) its loader opens with torch.load loads with "
                                 f"weights_only=True{extra} ({rules}); torch.load cannot open the folder itself")
    return Check(name, False, f"torch.load(weights_only=True) refuses {len(refused)} of its {len(opened)} file(s) "
                              f"({rules}): " + listing([f.line() for f in refused], 3))
