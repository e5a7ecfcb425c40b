"""What the real loaders do with each file: the reference side of the parity harness.

Usage: ``python tests/helpers/reference_loaders.py MANIFEST.json RESULTS.jsonl``

MANIFEST is a JSON list of ``{"name", "path", "kind", "marker", "cls"}``. torch
is imported once; each case then runs in a forked child (so one hanging or
crashing load costs only its own timeout) and reports, one JSON line per case:

- ``wo_true``: ``torch.load(weights_only=True)``: ``ok``, ``error``, the unsupported
  globals torch names in its message (``needs_first``: torch names only the first
  it meets), ``ran`` (the case's marker appeared);
- ``unsafe_globals``: ``torch.serialization.get_unsafe_globals_in_checkpoint``
  (static; zip checkpoints only);
- ``needs_all`` (clean cases only): the globals that make weights_only load
  succeed, found by adding torch's reported global to ``safe_globals`` and
  retrying; ``needs_loads`` says whether the load then succeeded (issue 15);
- ``safetensors``: ``safe_open(framework="pt")`` and ``get_tensor`` of every key;
- ``pickle``: ``pickle.load`` of the file, ``ok`` only when that one pickle spans
  the whole file (a plain pickle file, as ``pickle.dump`` writes one; a legacy
  torch file is several pickles and raw bytes, so it is not "read" by this step,
  nor is a file whose pickle is torch's legacy magic number);
  ``ran`` as above. ckpt's contract names plain pickle files as inputs, and
  torch.load does not read them (it expects the legacy magic number);
- ``wo_false``: ``torch.load(weights_only=False)``, ``ran`` as above;
- the loaders a file's name or bytes select besides torch.load (issue 21), each only
  where it applies: ``numpy`` (``np.load(allow_pickle=True)`` of a ``.npy``/``.npz``,
  every member of an ``.npz`` read), ``jit`` (``torch.jit.load`` of a zip holding
  ``constants.pkl``), ``package`` (``torch.package.PackageImporter`` of a zip holding
  ``.data/extern_modules``, every ``.pkl`` resource through ``load_pickle``), and for
  folders ``dcp`` (``FileSystemReader(folder).read_metadata()`` when ``.metadata`` is
  there, then ``dcp_to_torch_save``, which torch.loads bytes items with
  ``weights_only=False``) and ``index`` (every shard a ``*.index.json`` names, joined to the folder
  as transformers joins them, through ``torch.load(weights_only=False)`` or
  safetensors);
- ``at_exit``: the child's exit hooks (``atexit``, what ``weakref.finalize``
  registered) run after every other step, then the marker is checked (``ok`` is
  None: running exit hooks reads nothing). Before every marker check the child
  collects garbage and joins the threads a payload started (``threading.Timer``).

Folders are reported file by file (``files``: relative path -> the same steps).
Special files (``kind == "special"``: FIFOs, devices) are never opened: torch
and safetensors block on them forever, so their verdict is "refused (hangs)"
by construction. Run this in a throwaway directory: payloads only touch their
marker files, but loaders may write beside themselves.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import select
import signal
import stat
import sys
import time
import traceback
import warnings
from typing import Any

TIMEOUT_S = float(os.environ.get("REFERENCE_TIMEOUT_S", "30"))
# Modules the payloads import: imported once here so forked children do not each pay for them. Never
# torch._dynamo (nor torch._inductor, which imports it): importing it changes what torch.load(weights_only=True)
# accepts (nested jagged tensors), and a deployment's fresh process has not imported it.
PREIMPORT = (
    "torch.utils.collect_env", "torch.jit.unsupported_tensor_ops", "torch.fx.graph_module",
    "torch.utils.cpp_extension", "torch.hub", "torch.utils._config_module",
    "timeit", "cProfile", "pkgutil",
    "torch.fx.graph_module", "torch.utils.data.datapipes.utils.decoder", "torch.distributed.checkpoint",
    "torch.package", "numpy.lib._format_impl", "numpy.lib._npyio_impl", "wave", "mailbox", "codecs",
)
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
CLEAN_CLASSES = {"weights-only-metadata", "clean-control", "quantized", "benign-feature"}
UNSUPPORTED = re.compile(r"GLOBAL (\S+) was not an allowed global by default")
BLOCKED = re.compile(r"unsupported GLOBAL (\S+) whose module (\S+) is blocked")


class TrainConfig:
    """``__main__.TrainConfig``: the training script's own class, present where it loads its checkpoints."""


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "type": type(exc).__name__, "error": str(exc)[:3000]}


def _settle() -> None:
    """Let what a payload scheduled happen: finalizers of dead objects, threads it started."""
    import gc
    import threading

    gc.collect()
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join(5)


def _marker_ran(marker: str | None) -> bool:
    _settle()
    if marker and os.path.exists(marker):
        os.remove(marker)
        return True
    return False


def _resolve(full: str) -> Any:
    if "." not in full:  # torch names builtins without their module
        import builtins

        return getattr(builtins, full)
    parts = full.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(full)


def _wo_true(torch: Any, path: str, marker: str | None, extra: list[Any] | None = None) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(extra or []):
            torch.load(path, weights_only=True, map_location="cpu")
        out: dict[str, Any] = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - every refusal is a verdict
        out = _error(exc)
        msg = str(exc)
        out["needs_first"] = UNSUPPORTED.findall(msg) + [m[0] for m in BLOCKED.findall(msg)]
        out["blocked"] = bool(BLOCKED.search(msg))
    out["ran"] = _marker_ran(marker)
    return out


def _needs_all(torch: Any, path: str, first: dict[str, Any]) -> dict[str, Any]:
    """Add each global torch reports to safe_globals and retry (clean cases only)."""
    needs: list[str] = []
    objs: list[Any] = []
    res = first
    for _ in range(25):
        if res["ok"] or res.get("blocked") or not res.get("needs_first"):
            break
        name = res["needs_first"][0]
        if name in needs:
            break
        try:
            objs.append(_resolve(name))
        except Exception as exc:  # noqa: BLE001 - an unresolvable global ends the search
            return {"needs": [*needs, name], "loads": False, "unresolvable": f"{name}: {exc}"}
        needs.append(name)
        res = _wo_true(torch, path, None, objs)
    return {"needs": needs, "loads": bool(res["ok"]), "last_error": None if res["ok"] else res.get("error", "")[:500]}


def _safetensors(path: str, marker: str | None) -> dict[str, Any]:
    from safetensors import safe_open

    try:
        n = 0
        with safe_open(path, framework="pt") as f:
            for k in list(f.keys()):  # safe_open is not iterable
                f.get_tensor(k)
                n += 1
            f.metadata()
        out: dict[str, Any] = {"ok": True, "tensors": n}
    except BaseException as exc:  # noqa: BLE001
        out = _error(exc)
    out["ran"] = _marker_ran(marker)
    return out


def _pickle(path: str, marker: str | None) -> dict[str, Any]:
    import pickle

    try:
        with open(path, "rb") as f:
            obj = pickle.load(f)
            trailing = len(f.read())
        if type(obj) is int and obj == LEGACY_MAGIC:
            return {"ok": False, "error": "starts with torch's legacy magic number: judged by torch.load",
                    "ran": _marker_ran(marker)}
        out: dict[str, Any] = {"ok": trailing == 0, "trailing": trailing}
        if trailing:
            out["error"] = f"{trailing} bytes after the pickle's STOP"
    except BaseException as exc:  # noqa: BLE001
        out = _error(exc)
    out["ran"] = _marker_ran(marker)
    return out


def _wo_false(torch: Any, path: str, marker: str | None) -> dict[str, Any]:
    try:
        torch.load(path, weights_only=False, map_location="cpu")
        out: dict[str, Any] = {"ok": True}
    except BaseException as exc:  # noqa: BLE001
        out = _error(exc)
    out["ran"] = _marker_ran(marker)
    return out


def _guarded(marker: str | None, load) -> dict[str, Any]:
    try:
        out: dict[str, Any] = {"ok": True, **(load() or {})}
    except BaseException as exc:  # noqa: BLE001 - every refusal is a verdict
        out = _error(exc)
    out["ran"] = _marker_ran(marker)
    return out


def _zip_names(path: str) -> list[str]:
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except Exception:  # noqa: BLE001 - not a zip: no zip-based loader applies
        return []


def _numpy(path: str, marker: str | None) -> dict[str, Any]:
    def load() -> dict[str, Any]:
        import numpy as np

        obj = np.load(path, allow_pickle=True)
        if hasattr(obj, "files"):  # an NpzFile: members are read when indexed
            with obj:
                for k in obj.files:
                    obj[k]
            return {"members": len(obj.files)}
        return {}
    return _guarded(marker, load)


def _package(path: str, marker: str | None) -> dict[str, Any]:
    def load() -> dict[str, Any]:
        from torch.package import PackageImporter

        imp = PackageImporter(path)
        n = 0
        for name in _zip_names(path):
            rel = name.split("/", 1)[1] if "/" in name else name
            if rel.endswith(".pkl") and not rel.startswith(".data/"):
                pkg, _, res = rel.rpartition("/")
                imp.load_pickle(pkg.replace("/", "."), res)
                n += 1
        return {"pickles": n}
    return _guarded(marker, load)


def _dcp(torch: Any, folder: str, marker: str | None) -> dict[str, Any]:
    """read_metadata, then every item through dcp_to_torch_save (bytes items: load_bytes, weights_only=False)."""
    def load() -> None:
        import tempfile

        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        FileSystemReader(folder).read_metadata()
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(folder, os.path.join(tmp, "out.pt"))
    return _guarded(marker, load)


def _index(torch: Any, folder: str, index: str, marker: str | None) -> dict[str, Any]:
    def load() -> dict[str, Any]:
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for shard in shards:
            full = os.path.join(folder, shard)  # as transformers' load_sharded_checkpoint joins them
            if shard.endswith(".safetensors"):
                from safetensors.torch import load_file

                load_file(full)
            else:
                torch.load(full, weights_only=False, map_location="cpu")
        return {"shards": shards}
    return _guarded(marker, load)


def _other_loaders(torch: Any, path: str, marker: str | None, emit) -> None:
    """The loaders this file's name or bytes select besides torch.load and safetensors."""
    if path.endswith((".npy", ".npz")):
        emit("numpy", _numpy(path, marker))
    names = _zip_names(path)
    if any(n == "constants.pkl" or n.endswith("/constants.pkl") for n in names):
        emit("jit", _guarded(marker, lambda: bool(torch.jit.load(path, map_location="cpu")) and None))
    if any(n.endswith(".data/extern_modules") for n in names):
        emit("package", _package(path, marker))


def _folder_steps(torch: Any, folder: str, marker: str | None, emit) -> None:
    if os.path.isfile(os.path.join(folder, ".metadata")):
        emit("dcp", _dcp(torch, folder, marker))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".index.json"):
            emit("index", _index(torch, folder, os.path.join(folder, name), marker))


def _file_steps(torch: Any, path: str, marker: str | None, cls: str, emit) -> None:
    first = _wo_true(torch, path, marker)
    emit("wo_true", first)
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        emit("unsafe_globals", {"ok": True, "globals": sorted(unsafe)})
    except BaseException as exc:  # noqa: BLE001
        emit("unsafe_globals", _error(exc))
    if cls in CLEAN_CLASSES and not first["ok"] and not first["ran"]:
        emit("needs_all", _needs_all(torch, path, first))
    emit("safetensors", _safetensors(path, marker))
    emit("pickle", _pickle(path, marker))
    _other_loaders(torch, path, marker, emit)
    emit("wo_false", _wo_false(torch, path, marker))


def _folder_files(folder: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            try:
                if stat.S_ISREG(os.stat(p).st_mode):
                    out.append(p)
            except OSError:
                continue
    return out


def _child(case: dict[str, Any], wfd: int) -> None:
    import torch

    def emit_to(prefix: str):
        def emit(step: str, result: dict[str, Any]) -> None:
            os.write(wfd, (json.dumps({"file": prefix, "step": step, "result": result}) + "\n").encode())
        return emit

    if case["kind"] == "folder":
        files = _folder_files(case["path"])
        os.write(wfd, (json.dumps({"file": None, "step": "listing",
                                   "result": [os.path.relpath(p, case["path"]) for p in files]}) + "\n").encode())
        for p in files:
            _file_steps(torch, p, case["marker"], case["cls"], emit_to(os.path.relpath(p, case["path"])))
        _folder_steps(torch, case["path"], case["marker"], emit_to(""))
    else:
        _file_steps(torch, case["path"], case["marker"], case["cls"], emit_to(""))
    import atexit

    atexit._run_exitfuncs()  # the child leaves through os._exit, which skips them
    emit_to("")("at_exit", {"ok": None, "ran": _marker_ran(case["marker"])})


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": case["name"], "kind": case["kind"]}
    if case["kind"] == "special":
        out["skipped"] = "special file: never opened (torch.load and safe_open block on it)"
        return out
    rfd, wfd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: load, report through the pipe, never return into the parent's code
        os.close(rfd)
        code = 0
        try:
            _child(case, wfd)
        except BaseException:  # noqa: BLE001 - report the harness's own failure, then exit
            os.write(wfd, (json.dumps({"file": None, "step": "harness_error",
                                       "result": traceback.format_exc()[-2000:]}) + "\n").encode())
            code = 1
        os._exit(code)
    os.close(wfd)
    buf = b""
    timed_out = False
    while True:
        left = TIMEOUT_S - (time.monotonic() - start)
        if left <= 0:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select([rfd], [], [], left)
        if ready:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            buf += chunk
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    out["timed_out"] = timed_out
    out["exit_status"] = status
    out["seconds"] = round(time.monotonic() - start, 3)
    files: dict[str, dict[str, Any]] = {}
    for line in buf.decode(errors="replace").splitlines():
        rec = json.loads(line)
        if rec["step"] in ("listing", "harness_error"):
            out[rec["step"]] = rec["result"]
        else:
            files.setdefault(rec["file"], {})[rec["step"]] = rec["result"]
    if case["kind"] == "folder":
        out["files"] = files
    else:
        out["steps"] = files.get("", {})
    return out


def main(argv: list[str]) -> int:
    warnings.simplefilter("ignore")
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401 - imported once, before forking

    for mod in PREIMPORT:
        with contextlib.suppress(Exception):  # a missing optional module only costs time in the child
            importlib.import_module(mod)
    import gc

    # Every child collects garbage before it looks for its marker (_settle). Without this, that collection
    # walks the ~million objects torch brought in, writing to each one's header and so copying, page by page,
    # the memory the fork shared: ~1.5 s a case, 8 minutes for the corpus. Frozen, the parent's objects are
    # left alone; what a payload creates after the fork is still collected (its finalizers still run).
    gc.collect()
    gc.freeze()
    with open(argv[1]) as f:
        manifest = json.load(f)
    with open(argv[2], "w") as out:
        for case in manifest:
            out.write(json.dumps(run_case(case)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
