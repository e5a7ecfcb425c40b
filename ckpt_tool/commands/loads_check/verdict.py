"""Will ``torch.load(path)`` (weights_only=True, torch's default since 2.6) load this checkpoint, and the safe fix.

The prediction itself is torch-free (pickles/torch_rules/predict.py, from what the
readers recorded: pickles/torch_rules/inputs.py); this module turns it into what
inspect, diff and gate report: the globals to allowlist and the exact line
that does it, or why no allowlist helps. A global that can run code
(``subprocess.Popen``, ``builtins.exec``, ...) is never offered for
allowlisting, and ``weights_only=False`` is never suggested: the other safe
fix is ``ckpt migrate --sanitize``, which rewrites the metadata into types
weights_only accepts.

A folder (a sharded set, a DCP or DeepSpeed checkpoint) is not something
``torch.load`` opens: it raises IsADirectoryError (and an index is JSON,
not a pickle). Its report says so (``loads`` false, ``applies`` false) and
gives the verdict file by file (``files``, folder_files.py): which loader
reads each file, and whether ``torch.load(file, weights_only=True)`` loads it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...model import Checkpoint
from ...pickles import severity
from .folder import TORCH_LOAD, FileVerdict, FolderVerdict, folder_verdict

MAX_FILE_LINES = 20  # per-file weights_only lines in the text reports (--json has them all)


@dataclass(frozen=True)
class WeightsOnlyReport:
    """The prediction for one input, with the advice that goes with it."""

    path: str
    loads: bool
    needs: tuple[str, ...]
    torch: str
    reason: str | None = None
    default_weights_only: bool = True
    applies: bool = True
    dangerous: tuple[str, ...] = ()  # in ``needs`` and able to run code: never allowlist them
    imports: tuple[str, ...] = ()  # modules the fix imports, one per need
    files: tuple[FileVerdict, ...] = ()  # a folder or index: the verdict for each file its loader reads
    whole_module: bool = False  # a pickled nn.Module (torch.save(model)): its weights are worth more than its classes

    @property
    def main_needs(self) -> tuple[str, ...]:
        """Needs defined in ``__main__``: only the script that defined them can import them, so no allowlist
        line run anywhere else loads the file (it fails with "module '__main__' has no attribute ...")."""
        return tuple(n for n in self.needs if n.startswith("__main__."))

    @property
    def fixable(self) -> bool:
        """Allowlisting ``needs`` makes it load (and none of them is dangerous)."""
        return self.applies and not self.loads and self.reason is None and not self.dangerous and not self.main_needs

    @property
    def fix(self) -> str | None:
        """The one line that loads the file with exactly these globals allowed, or None."""
        if not self.fixable:
            return None
        names = ", ".join(_expression(n) for n in self.needs)
        return f"with torch.serialization.safe_globals([{names}]): torch.load({_py_str(self.path)})"

    @property
    def fix_imports(self) -> str | None:
        mods = sorted(set(self.imports) | {"torch"})
        return f"import {', '.join(mods)}" if self.fixable else None

    @property
    def sanitize_command(self) -> str | None:
        """``ckpt migrate --sanitize`` turns the metadata into types weights_only accepts (torch files only)."""
        if self.loads or not self.applies or self.dangerous or self.whole_module or os.path.isdir(self.path):
            return None
        root, ext = os.path.splitext(self._local())
        out = f"{root}.weights_only{ext if ext in ('.pth', '.pt', '.bin', '.ckpt') else '.pth'}"
        from shlex import quote  # only for the advice: its import compiles a regex on every run

        return f"ckpt migrate {quote(self.path)} -o {quote(out)} --sanitize"

    @property
    def extract_command(self) -> str | None:
        """A pickled nn.Module: its state_dict written out without running it, what loads anywhere."""
        if self.loads or not self.applies or not self.whole_module or os.path.isdir(self.path):
            return None
        out = f"{os.path.splitext(self._local())[0]}.state_dict.safetensors"
        from shlex import quote

        return f"ckpt migrate {quote(self.path)} -o {quote(out)}"

    def _local(self) -> str:
        return self.path.rsplit("/", 1)[-1] if "://" in self.path else self.path  # a URL: write beside you

    @property
    def torch_loaded(self) -> tuple[FileVerdict, ...]:
        """The files of a folder that its loader opens with torch.load itself (a sharded set's .bin shards)."""
        return tuple(f for f in self.files if f.loader == TORCH_LOAD)

    def to_json(self) -> dict[str, Any]:
        return {
            "loads": self.loads, "needs": list(self.needs), "torch": self.torch, "reason": self.reason,
            "applies": self.applies, "default_weights_only": self.default_weights_only,
            "dangerous": list(self.dangerous), "fix": self.fix,
            "fix_imports": self.fix_imports, "sanitize": self.sanitize_command, "extract": self.extract_command,
            "files": [f.to_json() for f in self.files],
        }

    def headline(self) -> str:
        """One line: does torch.load load it, and if not, what it needs or why it never will."""
        rules = f"torch {self.torch} rules"
        if not self.applies and self.files:
            return f"{self.reason}; file by file ({rules}):"
        if not self.applies:
            return f"not applicable: {self.reason}"
        if self.loads:
            return f"torch.load(weights_only=True) loads it ({rules})"
        if self.dangerous:
            them = "it" if len(self.dangerous) == 1 else "them"
            return (f"torch.load(weights_only=True) refuses it ({rules}): it needs {', '.join(self.dangerous)}, "
                    f"which can run code: never allowlist {them}")
        if self.reason is not None:
            return f"torch.load(weights_only=True) refuses it ({rules}): {self.reason}; no allowlist helps"
        return f"torch.load(weights_only=True) refuses it ({rules}): needs {', '.join(self.needs)}"

    def lines(self) -> list[str]:
        """The headline and, when there is one, the safe fix (for the text reports)."""
        out = [self.headline()]
        if self.files:
            out += [f"  {f.line()}" for f in self.files[:MAX_FILE_LINES]]
            if len(self.files) > MAX_FILE_LINES:
                out.append(f"  ... and {len(self.files) - MAX_FILE_LINES} more files (--json lists them all)")
            return out
        if not self.default_weights_only and self.applies:
            out.append(f"  (torch {self.torch}'s torch.load defaults to weights_only=False; 2.6+ defaults to True)")
        if self.fix is not None:
            out.append(f"  fix, if you trust these classes: {self.fix_imports}")
            out.append(f"    {self.fix}")
        if self.main_needs and not self.dangerous and self.reason is None:
            out.append(f"  no allowlist helps elsewhere: {', '.join(self.main_needs)} lived in the script that saved "
                       "it (__main__), which no other program can import")
        extract = self.extract_command
        if extract is not None:
            out.append(f"  {'or extract' if self.fix else 'extract'} its weights (nothing is run; load them with "
                       f"model.load_state_dict(safetensors.torch.load_file(...))): {extract}")
        sanitize = self.sanitize_command
        if sanitize is not None:
            out.append(f"  {'or rewrite' if self.fix else 'rewrite'} it with plain metadata (no allowlist needed): "
                       f"{sanitize}")
        return out


def assess(ck: Checkpoint, torch_version: str | None = None) -> WeightsOnlyReport | None:
    """The prediction for a loaded checkpoint under ``torch_version`` (default: installed torch, else newest).

    None when the readers recorded nothing to predict from.
    """
    from ...pickles.torch_rules import WeightsOnlyInput, predict_input
    from .hf_folder import hf_folder_verdict

    folder = hf_folder_verdict(ck, torch_version, _per_file) or folder_verdict(ck, torch_version, _per_file)
    if folder is not None:
        return _folder_report(ck.path, folder, torch_version)
    inp = ck.weights_only
    if not isinstance(inp, WeightsOnlyInput):
        return None
    v = predict_input(inp, torch_version)
    modules = _modules(inp)
    imports = tuple(dict.fromkeys(_import_for(_split(n, modules)[0]) for n in v.needs))
    return WeightsOnlyReport(ck.path, v.loads, v.needs, v.torch, v.reason, v.default_weights_only, v.applies,
                             _dangerous(v.needs, modules), imports, whole_module=ck.layout == "module")


def _per_file(inp: Any, torch_version: str | None) -> tuple[bool, tuple[str, ...], str | None, tuple[str, ...]]:
    """(loads, needs, reason, dangerous needs) of torch.load(file, weights_only=True) for one file's input."""
    from ...pickles.torch_rules import predict_input

    v = predict_input(inp, torch_version)
    return v.loads, v.needs, v.reason, _dangerous(v.needs, _modules(inp))


def _dangerous(needs: tuple[str, ...], modules: dict[str, str]) -> tuple[str, ...]:
    """The needs that can run code: never offered for allowlisting."""
    return tuple(n for n in needs if severity.severity(*_split(n, modules)) == severity.DANGEROUS)


def _folder_report(path: str, folder: FolderVerdict, torch_version: str | None) -> WeightsOnlyReport:
    """torch.load(folder) loads nothing; ``needs`` and ``dangerous`` gather those of its files."""
    from ...pickles.torch_rules import rules_for

    rules = rules_for(torch_version)
    needs = tuple(sorted({n for f in folder.files for n in f.needs}))
    dangerous = tuple(sorted({n for f in folder.files for n in f.dangerous}))
    return WeightsOnlyReport(path, False, needs, f"{rules.version[0]}.{rules.version[1]}", folder.reason,
                             rules.default_weights_only, False, dangerous, files=folder.files)


def _modules(inp: Any) -> dict[str, str]:
    """"module.name" -> module, for every global the input's pickles name (to split needs correctly)."""
    out: dict[str, str] = {}
    for p in getattr(inp, "pickles", ()):
        for module, name in p.globals:
            out[f"{module}.{name}"] = module
    for _, part in getattr(inp, "parts", ()):
        if part is not None:
            out.update(_modules(part))
    return out


def _split(need: str, modules: dict[str, str]) -> tuple[str, str]:
    module = modules.get(need)
    if module is None:
        module = need.rpartition(".")[0] or "builtins"
    return module, need[len(module) + 1:] if need.startswith(module + ".") else need


def _import_for(module: str) -> str:
    """The module the fix imports: NumPy's own submodules come with ``import numpy``."""
    head = module.split(".")[0]
    if head == "torch":
        return "torch"
    if head == "numpy" and module.split(".")[1:2] in ([], ["core"], ["_core"], ["dtypes"]):
        return "numpy"
    return module


def _expression(need: str) -> str:
    """How the fix names a global: by its dotted path; NumPy 1.x's numpy.core as NumPy 2 spells it, by name."""
    if need.startswith("numpy.core."):
        return f'({"numpy._core." + need[len("numpy.core."):]}, "{need}")'
    return need


def _py_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = ["FileVerdict", "WeightsOnlyReport", "assess"]
