"""Consolidation benchmark (issues 14, 24): ckpt against each layout's own converter and the durable write.

Inputs, written by the generators in this folder (no training, no GPU):

- a DeepSpeed ZeRO-3 run folder (``generate_training.py``: fp32 masters and
  AdamW moments of a Llama-like model over 4 ranks);
- a model-only DCP folder (``generate_dcp.py``: FSDP2 ``Shard(0)`` chunks of
  a Llama-like fp32 model over 4 ranks, the layout of Accelerate's
  ``pytorch_model_fsdp_0``);
- torch's distributed Hugging Face safetensors (``generate_dist_safetensors.py``:
  the same model's ``Shard(0)`` rows in one safetensors file per rank,
  placed by ``DCP_SHARDING_INFO``, as ``HuggingFaceStorageWriter(save_distributed=True)``
  writes them).
- verl's per-rank DTensor files (``generate_ranks.py``: real DTensors saved
  by gloo processes), with verl's load-everything merge as the reference;
- a DeepSpeed pipeline-parallel run (``generate_deepspeed_parallel.py
  pipeline``: ``layer_XX-model_states.pt`` per layer over ``--world-size``
  stages, ZeRO-1 fp32 masters), with DeepSpeed's converter as the reference
  (it fails on pipeline runs: the row says how, and so does the goal line);
- a DeepSpeed universal checkpoint (``generate_deepspeed_parallel.py
  universal``: ds_to_universal's ``zero/<param>/fp32.pt``), with the script
  users write (torch.load(weights_only=True) of each fp32.pt, save_file);
- a Megatron-core torch_dist folder (``generate_megatron.py``: stacked
  ``decoder.layers.*``, per-layer chunks), migrated ``--unstack-layers``,
  with ``dcp_to_torch_save`` (stacked, a .pt) beside ckpt's stacked .pth.

In the same rounds, for each input: ``ckpt migrate`` to one .safetensors
with its default worker count and with ``--workers-rows`` (default 2)
(verified, fsynced, as users run it), the reference
converter (DeepSpeed's ``convert_zero_checkpoint_to_fp32_state_dict``,
safetensors output, from $DEEPSPEED_PYTHON, /work/dsvenv or this python if it
has DeepSpeed, skipped when absent; torch's ``dcp_to_torch_save``, a .pt, with ckpt's .pth of the same
container beside it; torch's ``consolidate_safetensors_files``), and the
limit: a durable write of ckpt's output's bytes (the output ckpt wrote
earlier in the same round, copied by the kernel into one new file, fsynced
with its folder: what any converter must at least do), twice: in one go
then fsync, and 64 MiB at a time with early write-back as ckpt's writers do
it (the disk here is sometimes faster one way, sometimes the other). ckpt's
time is reported as a ratio to the faster of the two in the same round. Wall time and peak RSS (GNU time's %M) are medians over the counted
rounds; a first round warms the page cache and is not counted (--ref-runs N: the slow references, and
ckpt's outputs compared with them, run in the last N rounds only).

    python3 benchmarks/consolidate.py                 # ~4 GiB inputs, 3 counted rounds
    python3 benchmarks/consolidate.py --gib 1 --runs 2
    python3 benchmarks/consolidate.py --gib 2 --only pipeline,megatron   # some layouts (--only help lists them)

Writes benchmarks/RESULTS-consolidate.md (or --output) with PASS/FAIL lines
for the goals: ckpt at most 1.3x the durable write of its output's bytes,
peak memory at most the largest output tensor + 150 MiB, faster and smaller
than the reference converter, the default worker count no slower than any --workers N row.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
TIME = "/usr/bin/time"
BOUND = 150 << 20
DS_VENV = "/work/dsvenv/bin/python"
# DeepSpeed's converter runs from $DEEPSPEED_PYTHON, else /work/dsvenv, else this interpreter if it has DeepSpeed
DS_PYTHON = os.environ.get("DEEPSPEED_PYTHON") or (
    PY if not os.path.exists(DS_VENV) and importlib.util.find_spec("deepspeed") is not None else DS_VENV)

_DS = ("import sys\nfrom deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict as c\n"
       "c(sys.argv[1], sys.argv[2], safe_serialization=True)\n")
# The limit row: the output's own bytes (argv[2], a file or a folder's files one after another, just written and
# so in the page cache) copied by the kernel into one new file (argv[1]), fsynced with its folder. Its own bytes,
# not random ones: this machine's disk writes the generators' patterned values several times faster than
# os.urandom data (2 GiB: 3-6 s against 21-32 s), so only the same bytes make a fair limit.
# With argv[3] == "writeback" the copy goes 64 MiB at a time and asks the kernel to start writing each piece to the
# disk behind it (sync_file_range, as ckpt's writers do): the faster of the two is the limit of a round.
_DURABLE = """import ctypes, os, sys
src = sys.argv[2]
early = len(sys.argv) > 3 and sys.argv[3] == "writeback"
sfr = ctypes.CDLL(None).sync_file_range if early else None
if sfr is not None:
    sfr.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
files = ([os.path.join(d, n) for d, _, ns in sorted(os.walk(src)) for n in sorted(ns)] if os.path.isdir(src)
         else [src])
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
pos = 0
for name in files:
    with open(name, "rb") as f:
        left = os.fstat(f.fileno()).st_size
        while left:
            n = os.copy_file_range(f.fileno(), fd, min(left, 64 << 20 if early else 1 << 30))
            if n == 0:
                break
            if sfr is not None:
                sfr(fd, pos, n, 2)  # SYNC_FILE_RANGE_WRITE
            pos += n
            left -= n
os.fsync(fd)
os.close(fd)
d = os.open(os.path.dirname(os.path.abspath(sys.argv[1])), os.O_RDONLY)
os.fsync(d)
os.close(d)
"""
_HF = ("import sys\n"
       "from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files as c\n"
       "from safetensors import safe_open\nimport glob, os\nkeys = {}\n"
       "for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.safetensors'))):\n"
       "    with safe_open(f, 'np') as h: keys.update(dict.fromkeys(h.keys(), 1))\n"
       "os.makedirs(sys.argv[2])\nc(sys.argv[1], sys.argv[2], keys)\n")
# The script users write for a universal checkpoint: every parameter's fp32.pt loaded whole, one save_file.
_UNIVERSAL = """import os, sys, torch
from safetensors.torch import save_file
with open(os.path.join(sys.argv[1], "latest_universal")) as f:
    zero = os.path.join(sys.argv[1], f.read().strip(), "zero")
sd = {}
for name in sorted(os.listdir(zero)):
    path = os.path.join(zero, name, "fp32.pt")
    if os.path.isfile(path):
        sd[name] = torch.load(path, map_location="cpu", weights_only=True)["param"]
save_file(sd, sys.argv[2])
"""
# What users fall back on when DeepSpeed's converter fails on a pipeline run: each layer file's weights (the live
# modules: equal to the fp32 masters in an fp32 run), named as PipelineModule.state_dict() names them.
_LAYERS = """import glob, os, re, sys, torch
from safetensors.torch import save_file
with open(os.path.join(sys.argv[1], "latest")) as f:
    tag = os.path.join(sys.argv[1], f.read().strip())
sd = {}
for path in sorted(glob.glob(os.path.join(tag, "layer_*-model_states.pt"))):
    layer = int(re.match(r"layer_(\\d+)-", os.path.basename(path)).group(1))
    for key, value in torch.load(path, map_location="cpu", weights_only=True).items():
        sd[f"{layer}.{key}"] = value
save_file(sd, sys.argv[2])
"""
_DCP = ("import sys, warnings\nwarnings.simplefilter('ignore')\n"
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
        "dcp_to_torch_save(sys.argv[1], sys.argv[2])\n")


@dataclass
class Row:
    label: str
    argv: list[str]
    output: str | None = None  # removed before each run
    kind: str = "ckpt"  # ckpt, limit, reference
    may_fail: bool = False  # a reference known to fail on this layout: its error is the result
    sparse: bool = False  # runs only in the last --ref-runs rounds (the references and the outputs beside them)
    error: str | None = None  # its last stderr line, when it failed
    times: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    @property
    def time(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def peak(self) -> int:
        return int(statistics.median(self.rss)) if self.rss else 0


def drop_caches() -> bool:
    """Evict clean page-cache pages (root on Linux), so the next command reads from the disk."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def run_once(row: Row, env: dict[str, str], cold: bool = False) -> tuple[float, int]:
    if row.output:
        _remove(row.output)
    if cold:
        drop_caches()
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        argv = [TIME, "-o", rss_file.name, "-f", "%M", *row.argv] if os.path.exists(TIME) else row.argv
        start = time.perf_counter()
        r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        wall = time.perf_counter() - start
        if r.returncode != 0 and row.may_fail:
            lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
            row.error = f"fails (exit {r.returncode}): {lines[-1].strip() if lines else 'no message'}"
            return wall, 0
        if r.returncode != 0:
            raise SystemExit(f"{row.label} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        text = rss_file.read().strip().splitlines()
    peak = int(text[-1]) * 1024 if text and text[-1].isdigit() else 0
    return wall, peak


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def measure(rows: list[Row], runs: int, env: dict[str, str], log: callable, cold: bool = False,
            ref_runs: int | None = None) -> None:
    """Every row once per round, in order; the limit rows right after the ckpt run whose output they copy.

    Rows marked ``sparse`` (the slow references and the outputs compared with them) run only in the last
    ``ref_runs`` rounds, without a warm-up. Outputs that nothing reads later are deleted as soon as possible, so
    an 8 GiB layout never holds more than its input, one ckpt output and the last round's reference outputs.
    """
    first_sparse = 1 if ref_runs is None else max(1, runs - ref_runs + 1)
    for round_ in range(runs + 1):  # round 0 warms the page cache (and the interpreters' bytecode)
        for row in rows:
            if row.error or (row.sparse and round_ < first_sparse):  # failed once: it fails every round
                continue
            wall, peak = run_once(row, env, cold and round_ > 0)
            if row.error:
                log(f"  {row.label}: {row.error}")
                continue
            if round_:
                row.times.append(wall)
                row.rss.append(peak)
            if row.kind == "limit" and row.output:
                _remove(row.output)  # a copy nothing compares
            log(f"  {'warm-up' if not round_ else f'round {round_}'}: {row.label}: {wall:.2f} s, "
                f"{peak / 2**20:.0f} MiB, load {os.getloadavg()[0]:.1f}")
        if round_ < runs:
            for row in rows:
                if row.output and not row.sparse:
                    _remove(row.output)


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def largest_tensor(src: str, env: dict[str, str], extra: tuple[str, ...] = ()) -> int:
    out = subprocess.run([PY, "-m", "ckpt_tool", "inspect", src, "--json", *extra], env=env, capture_output=True,
                         text=True, check=True).stdout
    return max(t["nbytes"] for t in json.loads(out)["tensors"])


@dataclass
class Table:
    """One layout: its rows, its input, and the inspect options that show the output's tensors."""

    name: str
    src: str
    rows: list[Row]
    inspect: tuple[str, ...] = ()


@dataclass(frozen=True)
class Context:
    data: str
    gib: float
    world: int
    work: str
    with_ds: bool
    log: callable

    @property
    def tag(self) -> str:
        return f"{self.gib:g}g-{self.world}r"


def _input(folder: str, marker: str, write: callable, log: callable) -> str:
    """``folder``, written by ``write(folder)`` unless ``marker`` in it says an earlier run wrote it whole."""
    if not os.path.exists(os.path.join(folder, marker)):
        log(f"writing {folder}")
        _remove(folder)
        write(folder)
    return folder


def limit_row(work: str, name: str, output: str, writeback: bool = False) -> Row:
    """The durable write of ``output``'s bytes (ckpt's, written earlier in the same round) to a new file."""
    out = os.path.join(work, f"{name}-limit{'-wb' if writeback else ''}.bin")
    if writeback:
        return Row("limit: the same, 64 MiB at a time with early write-back (sync_file_range)",
                   [PY, "-c", _DURABLE, out, output, "writeback"], out, kind="limit")
    return Row("limit: durable write of the output's bytes (new file + fsync)", [PY, "-c", _DURABLE, out, output],
               out, kind="limit")


def limit_times(rows: list[Row]) -> list[float]:
    """Per round, the faster of the limit rows: the durable write of the output's bytes done as well as it can be."""
    limits = [r.times for r in rows if r.kind == "limit"]
    return [min(ts) for ts in zip(*limits, strict=False)]


WORKER_ROWS: list[int] = [2]  # --workers N rows beside the default one (main sets them from --workers-rows)


def ckpt_rows(src: str, work: str, name: str, extra: tuple[str, ...] = ()) -> list[Row]:
    """ckpt with the default worker count (then the limit, which copies its output) and each of WORKER_ROWS."""
    opts = " ".join(extra) + " " if extra else ""
    out = os.path.join(work, f"{name}-default.safetensors")
    rows = [Row(f"ckpt migrate {opts}-o x.safetensors (default --workers: {DEFAULT_WORKERS} here)",
                [PY, "-m", "ckpt_tool", "migrate", src, *extra, "-o", out, "-q"], out)]
    rows += [limit_row(work, name, out), limit_row(work, name, out, True)]
    for workers in WORKER_ROWS:
        out = os.path.join(work, f"{name}-w{workers}.safetensors")
        rows.append(Row(f"ckpt migrate {opts}-o x.safetensors --workers {workers}",
                        [PY, "-m", "ckpt_tool", "migrate", src, *extra, "-o", out, "--workers", str(workers), "-q"],
                        out))
    return rows


def zero3_table(c: Context) -> Table:
    import generate_training

    z3 = _input(os.path.join(c.data, f"zero3-{c.tag}"), "latest", lambda f: generate_training.write_zero3(
        f, generate_training.llama_like_spec(c.gib, c.world)), c.log)
    rows = ckpt_rows(z3, c.work, "z3")
    if c.with_ds:
        out = os.path.join(c.work, "ds-out")
        rows.append(Row("DeepSpeed convert_zero_checkpoint_to_fp32_state_dict (safetensors)",
                        [DS_PYTHON, "-c", _DS, z3, out], out, kind="reference", sparse=True))
    return Table("DeepSpeed ZeRO-3", z3, rows)


def dcp_table(c: Context) -> Table:
    import generate_dcp

    dcp = _input(os.path.join(c.data, f"dcp-{c.tag}"), ".metadata", lambda f: generate_dcp.write_dcp(
        f, generate_dcp.llama_like_spec(c.gib, c.world)), c.log)
    rows = ckpt_rows(dcp, c.work, "dcp")
    pth = os.path.join(c.work, "dcp.pth")
    rows.append(Row("ckpt migrate -o x.pth (the container dcp_to_torch_save writes)",
                    [PY, "-m", "ckpt_tool", "migrate", dcp, "-o", pth, "-q"], pth, sparse=True))
    pt = os.path.join(c.work, "dcp-torch.pt")
    rows.append(Row("torch dcp_to_torch_save (.pt)", [PY, "-c", _DCP, dcp, pt], pt, kind="reference", sparse=True))
    return Table("DCP (FSDP2 Shard(0), model only)", dcp, rows)


def dist_st_table(c: Context) -> Table:
    """torch's distributed HF safetensors of the DCP input's model (generate_dist_safetensors.py)."""
    import generate_dcp
    import generate_dist_safetensors

    marker = f"shard-{c.world:05d}-model-00001-of-00001.safetensors"
    src = _input(os.path.join(c.data, f"dist-st-{c.tag}"), marker, lambda f: generate_dist_safetensors.
                 write_dist_safetensors(f, generate_dcp.llama_like_spec(c.gib, c.world)), c.log)
    rows = ckpt_rows(src, c.work, "dist-st")
    hf = os.path.join(c.work, "dist-st-torch")
    rows.append(Row("torch consolidate_safetensors_files", [PY, "-c", _HF, src, hf], hf, kind="reference", sparse=True))
    return Table("Distributed HF safetensors (save_distributed=True, Shard(0))", src, rows)


def ranks_table(c: Context) -> Table:
    """verl's per-rank DTensor files (issue 24): ckpt with 1 and 2 workers, the limit, verl's load-everything merge.

    The input is written by generate_ranks.py (real DTensors from ``world`` gloo processes); the reference is
    its ``--merge`` (torch.load(weights_only=False) of every rank inside a gloo process group, torch.cat of the
    local shards, safetensors save_file), timed and measured like the other references.
    """
    import generate_ranks

    src = _input(os.path.join(c.data, f"ranks-{c.tag}"), f"model_world_size_{c.world}_rank_{c.world - 1}.pt",
                 lambda f: generate_ranks.write_ranks(f, c.gib, c.world), c.log)
    rows = ckpt_rows(src, c.work, "ranks")
    out = os.path.join(c.work, "verl-merge.safetensors")
    rows.append(Row("verl's merge: torch.load(weights_only=False) every rank, cat, save_file",
                    [PY, os.path.join(HERE, "generate_ranks.py"), "--merge", src, out], out, kind="reference",
                    sparse=True))
    return Table("Per-rank DTensor files (verl, FSDP2 Shard(0))", src, rows)


def pipeline_table(c: Context) -> Table:
    """A DeepSpeed pipeline run over ``world`` stages; DeepSpeed's converter, which fails on it, as the reference."""
    import generate_deepspeed_parallel as gp

    src = _input(os.path.join(c.data, f"pipeline-{c.gib:g}g-{c.world}pp"), "latest", lambda f: gp.write_pipeline(
        f, gp.llama_pipeline_spec(c.gib, c.world)), c.log)
    rows = ckpt_rows(src, c.work, "pipeline")
    if c.with_ds:
        out = os.path.join(c.work, "ds-pipeline-out")
        rows.append(Row("DeepSpeed convert_zero_checkpoint_to_fp32_state_dict (safetensors)",
                        [DS_PYTHON, "-c", _DS, src, out], out, kind="reference",
                        may_fail=True, sparse=True))
    out = os.path.join(c.work, "pipeline-layers.safetensors")
    rows.append(Row("torch.load(weights_only=True) of each layer_XX file, save_file (the live fp32 modules)",
                    [PY, "-c", _LAYERS, src, out], out, kind="reference", sparse=True))
    return Table(f"DeepSpeed pipeline-parallel run (pp={c.world}, ZeRO-1)", src, rows)


def universal_table(c: Context) -> Table:
    """ds_to_universal's output of a tp=2 run; the plain script users write as the reference."""
    import generate_deepspeed_parallel as gp

    src = _input(os.path.join(c.data, f"universal-{c.gib:g}g-2tp"), "latest_universal", lambda f: gp.
                 write_universal(f, gp.llama_universal_spec(c.gib, 2)), c.log)
    rows = ckpt_rows(src, c.work, "universal")
    out = os.path.join(c.work, "universal-script.safetensors")
    rows.append(Row("torch.load(weights_only=True) of each zero/<param>/fp32.pt, save_file",
                    [PY, "-c", _UNIVERSAL, src, out], out, kind="reference", sparse=True))
    return Table("DeepSpeed universal checkpoint (ds_to_universal of tp=2)", src, rows)


def megatron_table(c: Context) -> Table:
    """Megatron-core torch_dist, unstacked; dcp_to_torch_save (stacked) beside ckpt's stacked .pth."""
    import generate_megatron

    src = _input(os.path.join(c.data, f"megatron-{c.gib:g}g"), "metadata.json", lambda f: generate_megatron.
                 write_megatron(f, generate_megatron.llama_like_spec(c.gib)), c.log)
    rows = ckpt_rows(src, c.work, "megatron", ("--unstack-layers",))
    pth = os.path.join(c.work, "megatron.pth")
    rows.append(Row("ckpt migrate -o x.pth (stacked: the container dcp_to_torch_save writes)",
                    [PY, "-m", "ckpt_tool", "migrate", src, "-o", pth, "-q"], pth, sparse=True))
    pt = os.path.join(c.work, "megatron-torch.pt")
    rows.append(Row("torch dcp_to_torch_save (.pt, stacked)", [PY, "-c", _DCP, src, pt], pt, kind="reference",
                    sparse=True))
    return Table("Megatron-core torch_dist (TP=1, --unstack-layers)", src, rows, ("--unstack-layers",))


LAYOUTS = {"zero3": zero3_table, "dcp": dcp_table, "dist-st": dist_st_table, "ranks": ranks_table,
           "pipeline": pipeline_table, "universal": universal_table, "megatron": megatron_table}
_EQUAL = """import glob, os, sys, torch
from safetensors.torch import load_file
def tensors(p):
    if os.path.isdir(p):
        out = {}
        for f in sorted(glob.glob(os.path.join(p, "*.safetensors"))):
            out.update(load_file(f))
        return out
    if p.endswith(".safetensors"):
        return load_file(p)
    sd = torch.load(p, mmap=True, weights_only=True)
    flat = {}
    for k, v in sd.items():
        flat.update({f"{k}.{kk}": vv for kk, vv in v.items()} if isinstance(v, dict) else {k: v})
    return flat
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bits = lambda t: t.contiguous().reshape(-1).view(torch.uint8)
def equal(x, y):  # tensors bit for bit; other entries (Megatron's _extra_state objects) by value
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return type(x) is type(y) and x == y
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(bits(x), bits(y))
same = set(a) == set(b) and all(equal(a[k], b[k]) for k in a)
print("bit-identical" if same else "DIFFERENT")
"""


def compare(a: str, b: str, env: dict[str, str]) -> str:
    """Whether two outputs hold the same tensors bit for bit (read with torch/safetensors, not ckpt)."""
    r = subprocess.run([PY, "-c", _EQUAL, a, b], env=env, capture_output=True, text=True, check=False)
    return r.stdout.strip() or f"compare failed: {r.stderr[-500:]}"


def check_outputs(name: str, rows: list[Row], env: dict[str, str], log: callable) -> list[str]:
    """The last round's outputs compared: ckpt with the reference (same format), the default with N workers."""
    mine = [r for r in rows if r.kind == "ckpt"]
    same_format = next((r for r in mine if "x.pth" in r.label), mine[0])  # the .pth beside dcp_to_torch_save's .pt
    pairs = [(same_format, r) for r in rows if r.kind == "reference" and not r.error]
    pairs += [(mine[0], r) for r in mine[1:] if "--workers" in r.label]
    found = []
    for mine, other in pairs:
        if mine.output and other.output and os.path.exists(mine.output) and os.path.exists(other.output):
            found.append(f"{name}: `{mine.label}` vs `{other.label}`: {compare(mine.output, other.output, env)}")
            log(found[-1])
    return found


def host_memory_note() -> list[str]:
    """What the report must say when this VM hands free memory back to its host (the rounds then swing)."""
    reporting = "/sys/module/page_reporting"
    if not os.path.isdir(reporting):
        return []
    return [f"This VM hands free memory back to its host ({reporting} is loaded). Page-cache pages taken from "
            "memory the host has taken back are filled at 0.1-0.3 GB/s instead of several GB/s (perf: the time is "
            "in copy_folio_from_iter_atomic), so a command that starts writing more than a fraction of a second "
            "after the last output was deleted may take 2-10x its usual time, whatever it runs. Measured here, "
            "the same 642 MiB kernel copy started 0.05-0.2 s after deleting the previous copy took 0.2-0.5 s in 15 "
            "of 16 tries, and 1-2.8 s in 15 of 16 started 0.5 s or 2 s after (started 1 s after: 0.2 s in 7 of 8; "
            "the pattern moves from minute to minute). ckpt starts writing about 0.1 s later than the limit's "
            "script (its imports and the run's metadata), so its rounds are hit more often. The per-round "
            "medians are the goal's measure; the best rounds show each command as fast as it goes when the "
            "host lets it."]


def per_round_ratio(row: Row, limit: list[float]) -> float:
    """The median over rounds of row / limit measured in the same round (the disk's load drifts between rounds)."""
    pairs = [a / b for a, b in zip(row.times, limit, strict=False) if b > 0]
    return statistics.median(pairs) if pairs else float("nan")


def best_round_ratio(row: Row, limit: list[float]) -> float:
    """The row's fastest round over the limit's fastest: each as fast as it goes when the host lets it."""
    return min(row.times) / min(limit) if row.times and limit and min(limit) > 0 else float("nan")


def goals(name: str, src_bytes: int, largest: int, rows: list[Row]) -> list[str]:
    limit = limit_times(rows)
    mine = [r for r in rows if r.kind == "ckpt"]
    best = mine[0]  # the default worker count: what users run
    refs = [r for r in rows if r.kind == "reference"]
    lines = []
    ratio = per_round_ratio(best, limit)
    fastest = best_round_ratio(best, limit)
    lines.append(f"{'PASS' if ratio <= 1.3 else 'FAIL'}  {name}: ckpt at {ratio:.2f}x the durable write of its "
                 f"output's bytes (median of each round's ratio to the faster limit row; medians {best.time:.2f} s "
                 f"vs {statistics.median(limit) if limit else float('nan'):.2f} s; goal <= 1.3x); "
                 f"best rounds {fastest:.2f}x")
    worst = max(r.peak for r in rows if r.kind == "ckpt")
    lines.append(f"{'PASS' if worst <= largest + BOUND else 'FAIL'}  {name}: ckpt peak {worst / 2**20:.0f} MiB "
                 f"<= largest tensor {largest / 2**20:.0f} MiB + 150 MiB")
    for ref in refs:
        if ref.error:  # nothing to be ahead of in time or memory: it gives no output
            lines.append(f"PASS  {name}: ahead of {ref.label.split(' (')[0]}: it {ref.error}; ckpt consolidates "
                         f"the run in {best.time:.2f} s, {worst / 2**20:.0f} MiB")
            continue
        ok = best.time < ref.time and worst < ref.peak
        lines.append(f"{'PASS' if ok else 'FAIL'}  {name}: ahead of {ref.label.split(' (')[0]}: "
                     f"{ref.time / best.time:.1f}x faster, {ref.peak / max(worst, 1):.1f}x less memory")
    for other in (r for r in mine[1:] if "--workers" in r.label):
        paired = statistics.median(a / b for a, b in zip(other.times, best.times, strict=False))
        lines.append(f"{'PASS' if paired >= 1 else 'FAIL'}  {name}: the default worker count "
                     f"({DEFAULT_WORKERS} here) {paired:.2f}x the speed of {other.label.split(' -o ')[-1][17:]} "
                     f"(median of per-round ratios; {other.time:.2f} s -> {best.time:.2f} s; "
                     f"{USABLE_CORES} usable cores)")
    return lines


def round_lines(rows: list[Row], limit: list[float]) -> list[str]:
    """Each counted round: ckpt's time, each limit row's, and their ratio (the goal's measure is their median)."""
    mine, limits = rows[0], [r for r in rows if r.kind == "limit"]
    out = ["| round | ckpt (s) | " + " | ".join(("limit", "limit, write-back")[:len(limits)]) +
           " | ckpt / faster limit |", "| ---: | ---: | " + " | ".join("---:" for _ in limits) + " | ---: |"]
    for i, (t, lim) in enumerate(zip(mine.times, limit, strict=False)):
        cells = " | ".join(f"{r.times[i]:.2f}" for r in limits)
        out.append(f"| {i + 1} | {t:.2f} | {cells} | {t / lim:.2f} |")
    return out


Result = tuple[str, str, int, int, list[Row], tuple[float, ...], tuple[float, ...]]


def report(results: list[Result], args: argparse.Namespace) -> str:
    refs = (f"the references and the outputs compared with them in the last {args.ref_runs} round(s) only"
            if args.ref_runs is not None else "every row in every round")
    out = ["# Consolidation benchmark (benchmarks/consolidate.py)", "",
           f"Inputs ~{args.gib:g} GiB each, {args.world_size} ranks; {args.runs} counted round(s) after a warm-up "
           f"round ({refs}), medians; {os.cpu_count()} cores ({USABLE_CORES} usable: ckpt's default worker count "
           f"here is {DEFAULT_WORKERS}); python {sys.version.split()[0]}; load average (1, 5, 15 min) "
           f"{_load(args.load_before)} at the start, {_load(os.getloadavg())} at the end (other jobs share "
           "the machine).", "", *host_memory_note(), ""]
    passes = []
    for name, src, src_bytes, largest, rows, load0, load1 in results:
        out += [f"## {name}", "", f"`{os.path.basename(src)}`: {src_bytes / 2**30:.2f} GiB in the input files, "
                f"largest output tensor {largest / 2**20:.0f} MiB; load average {_load(load0)} at the start, "
                f"{_load(load1)} at the end", "",
                "| command | time (s) | x limit (per round, the faster row) | x limit (best rounds) | "
                "peak RSS (MiB) | input GB/s |",
                "| --- | ---: | ---: | ---: | ---: | ---: |"]
        limit = limit_times(rows)
        for r in rows:
            if r.error:
                out.append(f"| {r.label} | {r.error.replace('|', '/')} | | | | |")
                continue
            ratio = per_round_ratio(r, limit) if limit else float("nan")
            out.append(f"| {r.label} | {r.time:.2f} | {ratio:.2f} | {best_round_ratio(r, limit):.2f} | "
                       f"{r.peak / 2**20:.0f} | {src_bytes / r.time / 1e9:.2f} |")
        out += ["", "Round by round (ckpt's default row and the limit rows, in the order they ran):", "",
                *round_lines(rows, limit), ""]
        passes += goals(name, src_bytes, largest, rows)
    out += ["## Goals", "", "```", *passes, "```", ""]
    return "\n".join(out)


def _load(avg: tuple[float, ...]) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def _machine() -> tuple[int, int]:
    """The usable cores and the default worker count ckpt picks here for a large consolidation."""
    sys.path.insert(0, ROOT)
    from ckpt_tool.commands.migrate.parallel.choice import default_workers, usable_cores

    cores = usable_cores()
    return cores, default_workers(cores, 1 << 40)


USABLE_CORES, DEFAULT_WORKERS = _machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ref-runs", type=int, default=None, metavar="N",
                        help="run the references (and the outputs compared with them) in the last N rounds only")
    parser.add_argument("--workers-rows", default="2", metavar="N[,N...]",
                        help="--workers N rows beside the default worker count (default: 2; '' for none)")
    parser.add_argument("--delete-inputs", action="store_true",
                        help="delete each layout's input once it is measured (8 GiB inputs on a small disk)")
    parser.add_argument("--data", default=os.path.join(HERE, "data"))
    parser.add_argument("--output", help="default: benchmarks/RESULTS-consolidate.md for every layout, "
                        "DATA/RESULTS-consolidate-only.md with --only (so a partial run never replaces it)")
    parser.add_argument("--no-deepspeed", action="store_true", help="leave out DeepSpeed's converter")
    parser.add_argument("--cache", choices=("warm", "cold", "both"), default="warm",
                        help="warm: inputs in the page cache; cold: caches dropped before every command (root)")
    parser.add_argument("--only", default=",".join(LAYOUTS), metavar="LAYOUT[,LAYOUT...]",
                        help=f"the layouts to measure (default: all): {', '.join(LAYOUTS)}")
    args = parser.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in LAYOUTS]
    if unknown or not only:
        parser.error(f"--only: unknown layout(s) {', '.join(unknown) or '(none given)'}; choose from "
                     f"{', '.join(LAYOUTS)}")
    if args.output is None:
        partial = set(only) != set(LAYOUTS)
        args.output = os.path.join(args.data, "RESULTS-consolidate-only.md") if partial else \
            os.path.join(HERE, "RESULTS-consolidate.md")
    args.load_before = os.getloadavg()
    WORKER_ROWS[:] = [int(x) for x in args.workers_rows.split(",") if x.strip()]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    os.makedirs(args.data, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure ckpt as installed (bytecode compiled once)
    subprocess.run([PY, "-m", "compileall", "-q", os.path.join(ROOT, "ckpt_tool")], env=env, check=True)
    sys.path.insert(0, HERE)  # the generators
    with_ds = not args.no_deepspeed and os.path.exists(DS_PYTHON)
    if not with_ds:
        log("DeepSpeed's converter left out (no DeepSpeed python; set DEEPSPEED_PYTHON)")
    work = tempfile.mkdtemp(prefix="consolidate-", dir=args.data)
    context = Context(args.data, args.gib, args.world_size, work, with_ds, log)
    results = []
    checks: list[str] = []
    modes = ["warm", "cold"] if args.cache == "both" else [args.cache]
    if "cold" in modes and not drop_caches():
        raise SystemExit("--cache cold needs to write /proc/sys/vm/drop_caches (root on Linux)")
    try:
        for mode in modes:
            for key in only:
                table = LAYOUTS[key](context)
                name, src, rows = f"{table.name}, {mode} cache", table.src, table.rows
                log(f"{name}: {src}")
                load0 = os.getloadavg()
                measure(rows, args.runs, env, log, cold=mode == "cold", ref_runs=args.ref_runs)
                load1 = os.getloadavg()
                results.append((name, src, folder_bytes(src), largest_tensor(src, env, table.inspect), rows,
                                load0, load1))
                if mode == modes[0]:
                    checks += check_outputs(name, rows, env, log)
                for r in rows:
                    if r.output:
                        _remove(r.output)
                if args.delete_inputs and mode == modes[-1]:
                    _remove(src)
                _write(args.output, report(results, args), checks)  # what finished survives a later failure
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(_write(args.output, report(results, args), checks))
    return 0


def _write(path: str, text: str, checks: list[str]) -> str:
    text += "\n## Outputs compared\n\n" + "\n".join(f"- {c}" for c in checks) + "\n"
    with open(path, "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
