"""ckpt against what a user could run instead: whole processes, side by side, medians.

    python3 benchmarks/run.py            # full: 1 GiB, 4 GiB (+ sharded), 200k tensors (~20-30 min)
    python3 benchmarks/run.py --quick    # 1 GiB and 200k tensors only (a few minutes)

Generates its inputs into benchmarks/data/ (git-ignored; reused when present),
runs every command as a separate process (ckpt as ``python3 -m ckpt_tool``
from this checkout, no install needed), and records each run's wall time and
the peak resident memory of that process alone (``os.wait4`` rusage, which is
per child, never cumulative). Commands in one group are run round-robin so
they see the same page-cache state; the first round is a warm-up and is not
counted. Writes benchmarks/RESULTS.md: the machine, a table of medians with
ratios to the best baseline, and one pass/fail line per goal of issue 7.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import generate  # noqa: E402 - benchmarks/generate.py, importable once HERE is on the path

PY = sys.executable
MIB = 1 << 20


# ----------------------------------------------------------------- measuring


@dataclass
class Cmd:
    """One command line to time, and what it is compared with."""

    label: str
    argv: list[str]
    baseline: bool = False
    runs: int = 5
    warmup: bool = True
    outputs: list[str] = field(default_factory=list)  # removed before and after each run
    ok_codes: tuple[int, ...] = (0,)
    read_bytes: int = 0  # bytes of input the command must read (throughput column)


@dataclass
class Result:
    cmd: Cmd
    walls: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)  # bytes
    error: str = ""

    @property
    def wall(self) -> float:
        return statistics.median(self.walls) if self.walls else float("nan")

    @property
    def peak(self) -> int:
        return int(statistics.median(self.rss)) if self.rss else 0


@dataclass
class Group:
    key: str
    title: str
    cmds: list[Cmd]
    results: list[Result] = field(default_factory=list)

    def result(self, label: str) -> Result | None:
        return next((r for r in self.results if r.cmd.label == label), None)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


TIME = "/usr/bin/time"


def run_once(cmd: Cmd, env: dict[str, str]) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS bytes of this process alone, exit code, stderr tail).

    The peak comes from GNU time, which forks the command: a process started
    straight from this one would inherit this process's own high-water mark
    at exec (Linux keeps the larger of the two in ru_maxrss).
    """
    for out in cmd.outputs:
        _remove(out)
    with tempfile.TemporaryFile() as err, tempfile.NamedTemporaryFile("r") as rss_file:
        argv = [TIME, "-o", rss_file.name, "-f", "%M", *cmd.argv] if os.path.exists(TIME) else cmd.argv
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, env=env, cwd=ROOT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()  # interrupted: leave no command running behind us
            proc.wait()
            raise
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read()[-2000:].decode("utf-8", "replace")
        lines = [ln for ln in rss_file.read().splitlines() if ln.strip().isdigit()]
        peak_kib = int(lines[-1]) if lines else usage.ru_maxrss  # both in KiB on Linux
    for out in cmd.outputs:
        _remove(out)
    return wall, peak_kib * 1024, code, tail


SLOW = 8.0  # seconds: a command this slow counts its warm-up run and runs at most slow_runs times
SETTINGS = {"slow_runs": 3, "quick": False}  # --quick: slow commands run once, the slowest baselines are left out


def measure(group: Group, env: dict[str, str], log: Callable[[str], None]) -> None:
    results = [Result(c) for c in group.cmds]
    rounds = max(c.runs for c in group.cmds)
    for rnd in range(rounds + 1):
        for res in results:
            c = res.cmd
            if res.error or (rnd == 0 and not c.warmup) or (rnd > 0 and len(res.walls) >= c.runs):
                continue
            wall, rss, code, tail = run_once(c, env)
            if code not in c.ok_codes:
                res.error = f"exit {code}: " + (tail.strip().splitlines() or [""])[-1][:300]
                log(f"  {c.label}: FAILED ({res.error})")
                continue
            if wall > SLOW and c.runs > SETTINGS["slow_runs"]:
                c.runs = SETTINGS["slow_runs"]  # a baseline that takes a minute: few runs keep the run short
            if rnd == 0 and c.warmup and wall <= SLOW:
                continue  # the warm-up round is not counted (a slow command is its own warm-up)
            res.walls.append(wall)
            res.rss.append(rss)
    for res in results:
        if res.walls:
            log(f"  {res.cmd.label:<58} {res.wall:8.3f} s {res.peak / MIB:9.1f} MiB")
    group.results = results


# ------------------------------------------------------------------ the plan


def ckpt(*args: str) -> list[str]:
    return [PY, "-m", "ckpt_tool", *args]


# ckpt from a given checkout, started the same way for this one and for --previous's (like for like)
_LAUNCH = ("import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'ckpt'; "
           "runpy.run_module('ckpt_tool', run_name='__main__', alter_sys=True)")


def ckpt_at(tree: str, *args: str) -> list[str]:
    return [PY, "-c", _LAUNCH, tree, *args]


def previous_groups(inputs: dict[str, str], rev: str, tree: str, runs: int) -> list[Group]:
    """inspect and scan of each .pth by this checkout and by REV's, interleaved in the same rounds."""
    groups = []
    for name, prefix in inputs.items():
        pth = prefix + ".pth"
        n = max(runs * 2 + 1, 11) if name.startswith("lm-") else max(runs, 3)
        cmds = []
        for op in ("inspect", "scan"):
            cmds.append(Cmd(f"ckpt {op} .pth", ckpt_at(ROOT, op, pth), runs=n, ok_codes=(0, 1)))
            cmds.append(Cmd(f"ckpt@{rev} {op} .pth", ckpt_at(tree, op, pth), baseline=True, runs=n,
                            ok_codes=(0, 1)))
        groups.append(Group(f"{name}/previous", f"{name}: inspect and scan, this checkout against {rev}", cmds))
    return groups


def previous_tree(rev: str, data: str) -> str:
    """A detached worktree of REV under the data folder (git-ignored), compiled as an install would be."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    tree = os.path.join(data, f"previous-{sha}")
    if not os.path.isdir(tree):
        subprocess.run(["git", "worktree", "add", "--detach", "-f", tree, sha], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([PY, "-m", "compileall", "-q", os.path.join(tree, "ckpt_tool")], check=True,
                   stdout=subprocess.DEVNULL)
    return tree


def base(op: str, *args: str) -> list[str]:
    return [PY, os.path.join(HERE, "baselines.py"), op, *args]


def fsize(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def have_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def ckpt_commands() -> set[str]:
    """The ckpt commands this checkout has (others are listed as not measured)."""
    out = subprocess.run(ckpt("--help"), capture_output=True, text=True, cwd=ROOT, env=child_env()).stdout
    names = set()
    in_cmds = False
    for line in out.splitlines():
        if line.strip() == "Commands:":
            in_cmds = True
            continue
        if in_cmds and line.startswith("  ") and line.strip():
            names.add(line.split()[0])
    return names


DIFF_HTML = "ckpt diff --values --html .pth -near.safetensors"


def plan(inputs: dict[str, str], work: str, have_cmds: set[str], runs: int, data_runs: int) -> list[Group]:
    groups: list[Group] = []
    runs_lm = runs
    scan_tools = [c for c in (("picklescan", have("picklescan")), ("fickling", have_module("fickling"))) if c[1]]
    startup = [
        Cmd("python3 -c pass", [PY, "-c", "pass"], baseline=True, runs=runs),
        Cmd("python3 -c 'import click'", [PY, "-c", "import click"], baseline=True, runs=runs),
    ]
    groups.append(Group("startup", "Interpreter start (the floor for any CLI)", startup))
    biggest_lm = "lm-4g" if "lm-4g" in inputs else "lm-1g"

    for name, prefix in inputs.items():
        runs = runs_lm if name.startswith("lm-") else min(runs_lm, 3)  # 200k tensors: seconds per run
        pth, st = prefix + ".pth", prefix + ".safetensors"
        near = prefix + "-near.safetensors"
        sharded = prefix + "-sharded"
        is_lm = name.startswith("lm-")
        size = fsize(pth)
        out_st = os.path.join(work, f"{name}-out.safetensors")
        out_sh = os.path.join(work, f"{name}-out-sharded")
        out_cp = os.path.join(work, f"{name}-copy.pth")

        # metadata: inspect
        cmds = [
            Cmd("ckpt inspect .pth", ckpt("inspect", pth), runs=runs),
            Cmd("ckpt inspect --json .pth", ckpt("inspect", "--json", pth), runs=runs),
            Cmd("ckpt inspect .safetensors", ckpt("inspect", st), runs=runs),
            Cmd("ckpt inspect --json .safetensors", ckpt("inspect", "--json", st), runs=runs),
        ]
        if os.path.isdir(sharded):
            cmds.append(Cmd("ckpt inspect sharded/", ckpt("inspect", sharded), runs=runs))
        cmds += [
            Cmd("python: torch.load(mmap=True), list shapes .pth", base("torch-load-mmap", pth),
                baseline=True, runs=runs),
            Cmd("python: safe_open, list shapes .safetensors", base("safe-open-shapes", st), baseline=True, runs=runs),
        ]
        if os.path.isdir(sharded):
            cmds.append(Cmd("python: safe_open, list shapes sharded/", base("safe-open-shapes", sharded),
                            baseline=True, runs=runs))
        cmds.append(Cmd("python3 -c 'import click'", [PY, "-c", "import click"], baseline=True, runs=runs))
        groups.append(Group(f"{name}/inspect", f"{name}: inspect (metadata only)", cmds))

        # metadata: key/shape diff
        if "diff" in have_cmds:
            cmds = [
                Cmd("ckpt diff .pth .safetensors", ckpt("diff", pth, st), runs=runs, ok_codes=(0, 1)),
                Cmd("ckpt diff --json .pth .safetensors", ckpt("diff", "--json", pth, st), runs=runs,
                    ok_codes=(0, 1)),
            ]
            if os.path.isdir(sharded):
                cmds.append(Cmd("ckpt diff .pth sharded/", ckpt("diff", pth, sharded), runs=runs, ok_codes=(0, 1)))
            cmds += [
                Cmd("python: torch.load(mmap) + safe_open, compare", base("diff-keys", pth, st),
                    baseline=True, runs=runs),
                Cmd("python3 -c 'import click'", [PY, "-c", "import click"], baseline=True, runs=runs),
            ]
            groups.append(Group(f"{name}/diff", f"{name}: diff keys and shapes (metadata only)", cmds))

        # data: the disk limit and the loaders
        cmds = [
            Cmd("cat .pth > /dev/null", ["cat", pth], baseline=True, runs=data_runs, read_bytes=size),
            Cmd("python: torch.load .pth", base("torch-load", pth), baseline=True, runs=data_runs, read_bytes=size),
            Cmd("python: load_file + copy each tensor .safetensors", base("load-file-touch", st), baseline=True,
                runs=data_runs, read_bytes=fsize(st)),
        ]
        groups.append(Group(f"{name}/read", f"{name}: reading every byte (the disk limit, the loaders)", cmds))

        # data: value diff and NaN gate on a near-identical pair
        if is_lm and os.path.exists(near):
            pair = size + fsize(near)
            cmds = [Cmd("cat .pth -near.safetensors > /dev/null", ["cat", pth, near], baseline=True,
                        runs=data_runs, read_bytes=pair)]
            if "diff" in have_cmds:
                cmds.append(Cmd("ckpt diff --values .pth -near.safetensors", ckpt("diff", "--values", "-q", pth, near),
                                runs=data_runs, ok_codes=(0, 1), read_bytes=pair))
                # the HTML report also needs every tensor's norm (identical ones too) and bins the top tensors
                report = os.path.join(work, f"{name}-diff.html")
                cmds.append(Cmd(DIFF_HTML, ckpt("diff", "--values", "-q", "--html", report, pth, near),
                                runs=data_runs, ok_codes=(0, 1), read_bytes=pair, outputs=[report]))
            if "gate" in have_cmds:
                cmds.append(Cmd("ckpt gate .pth -near.safetensors (NaN check)", ckpt("gate", pth, near),
                                runs=data_runs, ok_codes=(0, 1), read_bytes=pair))
            cmds += [
                Cmd("python: max abs(a - b) per tensor (torch.load mmap + safe_open)", base("diff-values", pth, near),
                    baseline=True, runs=data_runs, read_bytes=pair),
                Cmd("python: torch.isfinite per tensor (mmap)", base("nan-check", pth, near), baseline=True,
                    runs=data_runs, read_bytes=pair),
            ]
            groups.append(Group(f"{name}/values", f"{name}: value diff and NaN check of a near-identical pair", cmds))
        elif "gate" in have_cmds:
            cmds = [
                Cmd("cat .pth > /dev/null", ["cat", pth], baseline=True, runs=data_runs, read_bytes=size),
                Cmd("ckpt gate .pth (NaN check)", ckpt("gate", pth), runs=data_runs, ok_codes=(0, 1), read_bytes=size),
                Cmd("python: torch.isfinite per tensor (mmap)", base("nan-check", pth), baseline=True,
                    runs=data_runs, read_bytes=size),
            ]
            groups.append(Group(f"{name}/values", f"{name}: NaN check", cmds))

        # data: migrate with verification
        strip = "model."
        cmds = [Cmd("cp .pth", ["cp", pth, out_cp], baseline=True, runs=data_runs, outputs=[out_cp],
                    read_bytes=size),
                # like for like: ckpt migrate fsyncs its output before renaming it into place
                Cmd("cp .pth && sync (fsync the copy)", ["sh", "-c", 'cp "$0" "$1" && sync "$1"', pth, out_cp],
                    baseline=True, runs=data_runs, outputs=[out_cp], read_bytes=size)]
        if "migrate" in have_cmds:
            cmds.append(Cmd(f"ckpt migrate .pth -> .safetensors --strip-prefix {strip}",
                            ckpt("migrate", pth, "-o", out_st, "--strip-prefix", strip, "-q"),
                            runs=data_runs, outputs=[out_st], read_bytes=size))
            if name == biggest_lm:
                cmds.append(Cmd(f"ckpt migrate .pth -> sharded/ --max-shard-size 1GB --strip-prefix {strip}",
                                ckpt("migrate", pth, "-o", out_sh, "--to", "safetensors", "--max-shard-size", "1GB",
                                     "--strip-prefix", strip, "-q"),
                                runs=data_runs, outputs=[out_sh], read_bytes=size))
        if is_lm or not SETTINGS["quick"]:  # a minute on 200,000 tensors
            cmds.append(Cmd("python: torch.load + save_file + load_file + torch.equal",
                            base("naive-migrate", pth, out_st + ".naive", strip), baseline=True,
                            runs=data_runs, warmup=False, outputs=[out_st + ".naive"], read_bytes=size))
        groups.append(Group(f"{name}/migrate", f"{name}: migrate .pth -> safetensors, verified", cmds))

        # scan
        if "scan" in have_cmds or scan_tools:
            cmds = []
            if "scan" in have_cmds:
                cmds.append(Cmd("ckpt scan .pth", ckpt("scan", pth), runs=runs, ok_codes=(0, 1)))
            if have("picklescan"):
                cmds.append(Cmd("picklescan -p .pth", ["picklescan", "-p", pth], baseline=True, runs=runs,
                                ok_codes=(0, 1)))
            if have_module("fickling") and (is_lm or not SETTINGS["quick"]):
                # fickling takes minutes on 200,000 tensors: one run there
                cmds.append(Cmd("python: fickling check_safety .pth", base("fickling-scan", pth), baseline=True,
                                runs=runs if is_lm else 1, warmup=is_lm))
            groups.append(Group(f"{name}/scan", f"{name}: security scan", cmds))
    if "lm-1g" in inputs and "lm-4g" in inputs:
        # 1 GiB and 4 GiB metadata answers in the same rounds: "flat in size" compares these
        cmds = []
        for op in ("inspect", "inspect --json", "diff"):
            for name in ("lm-1g", "lm-4g"):
                pth, st = inputs[name] + ".pth", inputs[name] + ".safetensors"
                args = [pth, st] if op == "diff" else [pth]
                cmds.append(Cmd(f"ckpt {op} {name}.pth" + (" .safetensors" if op == "diff" else ""),
                                ckpt(*op.split(), *args), runs=max(runs_lm * 2 + 1, 11), ok_codes=(0, 1)))
            if op == "inspect":
                for name in ("lm-1g", "lm-4g"):
                    cmds.append(Cmd(f"ckpt inspect {name}.safetensors", ckpt("inspect", inputs[name] + ".safetensors"),
                                    runs=max(runs_lm * 2 + 1, 11)))
        cmds.append(Cmd("python3 -c 'import click'", [PY, "-c", "import click"], baseline=True, runs=max(runs_lm * 2 + 1, 11)))
        groups.append(Group("size", "1 GiB against 4 GiB: metadata answers in the same rounds", cmds))
    return groups


# ------------------------------------------------------------------ reporting


def machine() -> list[str]:
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    cpu = next((ln.split(":", 1)[1].strip() for ln in read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor() or "?")
    mem = next((int(ln.split()[1]) * 1024 for ln in read("/proc/meminfo").splitlines()
                if ln.startswith("MemTotal")), 0)
    df = subprocess.run(["df", "-hT", generate.DEFAULT_DATA], capture_output=True, text=True).stdout.splitlines()
    disk = " ".join(df[-1].split()[:3]) if len(df) > 1 else "?"
    versions = subprocess.run(
        [PY, "-c", "import torch, safetensors, click; print(torch.__version__, safetensors.__version__, "
                   "click.__version__)"], capture_output=True, text=True).stdout.split()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "ckpt_tool"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    return [
        f"- date: {_dt.datetime.now().astimezone().isoformat(timespec='minutes')}",
        f"- cpu: {cpu}, nproc {os.cpu_count()}",
        f"- memory: {mem / (1 << 30):.1f} GiB; disk (benchmarks/data): {disk}",
        f"- python {platform.python_version()}, torch {versions[0] if versions else '?'}, "
        f"safetensors {versions[1] if len(versions) > 1 else '?'}, click {versions[2] if len(versions) > 2 else '?'}",
        f"- ckpt at commit {commit or '?'}{' + uncommitted changes in ckpt_tool/' if dirty else ''}",
    ]


def fmt_s(x: float) -> str:
    return "—" if x != x else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def table(group: Group) -> list[str]:
    bases = [r for r in group.results if r.cmd.baseline and r.walls]
    best = min(bases, key=lambda r: r.wall) if bases else None
    lines = [f"### {group.title}", ""]
    lines.append("| command | runs | median s | min-max s | peak RSS MiB | GB/s | time / best baseline |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in group.results:
        c = r.cmd
        name = ("" if c.baseline else "**") + c.label + ("" if c.baseline else "**")
        if r.error:
            lines.append(f"| {name} | 0 | error | | | | {r.error[:120]} |")
            continue
        if not r.walls:
            continue
        ratio = f"{r.wall / best.wall:.2f}x" if best and not c.baseline else ""
        gbs = f"{c.read_bytes / r.wall / 1e9:.2f}" if c.read_bytes else ""
        lines.append(
            f"| {name} | {len(r.walls)} | {fmt_s(r.wall)} | {fmt_s(min(r.walls))}-{fmt_s(max(r.walls))} "
            f"| {r.peak / MIB:.0f} | {gbs} | {ratio} |"
        )
    if best:
        lines.append("")
        lines.append(f"Best baseline: {best.cmd.label} ({fmt_s(best.wall)} s).")
    lines.append("")
    return lines


@dataclass
class Goal:
    text: str
    passed: bool | None  # None: a figure measured beside the others, with no goal set
    detail: str
    profile_cmd: list[str] | None = None


def _r(groups: dict[str, Group], gkey: str, label: str) -> Result | None:
    g = groups.get(gkey)
    r = g.result(label) if g else None
    return r if r is not None and r.walls else None


def _beside(groups: dict[str, Group], key: str) -> str:
    """The fastest baseline of a table, for goals in absolute seconds: how fast the machine was in that run."""
    group = groups.get(key)
    rows = [r for r in (group.results if group else []) if r.cmd.baseline and r.walls and not r.error
            and not r.cmd.label.startswith(("python3 -c", "cat ", "cp "))]
    if not rows:
        return ""
    best = min(rows, key=lambda r: r.wall)
    return f" (same rounds: {best.cmd.label} {fmt_s(best.wall)} s)"


def goals(groups: dict[str, Group], inputs: dict[str, str], quick: bool) -> list[Goal]:
    out: list[Goal] = []
    for key, group in groups.items():
        if not key.endswith("/previous"):
            continue
        for r in group.results:
            prev = next((p for p in group.results if p.cmd.baseline and p.cmd.label.split(" ", 1)[1] ==
                         r.cmd.label.split(" ", 1)[1]), None)
            if r.cmd.baseline or not prev or not r.walls or not prev.walls:
                continue
            ratio = r.wall / prev.wall
            out.append(Goal(f"{r.cmd.label} ({key.split('/')[0]}): no slower than {prev.cmd.label.split()[0]} "
                            "(within 5%, same rounds)", ratio <= 1.05,
                            f"{fmt_s(r.wall)} s vs {fmt_s(prev.wall)} s ({ratio:.2f}x)", r.cmd.argv))
    big = "lm-4g" if "lm-4g" in inputs else "lm-1g"
    note = "" if big == "lm-4g" else " (quick run: the 1 GiB file stands in for 4 GiB)"
    click_r = _r(groups, "startup", "python3 -c 'import click'")
    meta_ops = [("inspect", "ckpt inspect .pth"), ("inspect", "ckpt inspect .safetensors"),
                ("inspect", "ckpt inspect --json .pth"), ("inspect", "ckpt inspect --json .safetensors"),
                ("inspect", "ckpt inspect sharded/"), ("diff", "ckpt diff .pth .safetensors"),
                ("diff", "ckpt diff .pth sharded/")]
    # flat in size: from the table that ran 1 GiB and 4 GiB in the same rounds
    if "lm-4g" in inputs:
        for small_label, big_label in (("ckpt inspect lm-1g.pth", "ckpt inspect lm-4g.pth"),
                                       ("ckpt inspect lm-1g.safetensors", "ckpt inspect lm-4g.safetensors"),
                                       ("ckpt inspect --json lm-1g.pth", "ckpt inspect --json lm-4g.pth"),
                                       ("ckpt diff lm-1g.pth .safetensors", "ckpt diff lm-4g.pth .safetensors")):
            a, b = _r(groups, "size", small_label), _r(groups, "size", big_label)
            if a and b:
                ratio = b.wall / a.wall
                out.append(Goal(f"{big_label}: within 10% of 1 GiB", ratio <= 1.10,
                                f"{fmt_s(b.wall)} s vs {fmt_s(a.wall)} s ({ratio:.2f}x)", b.cmd.argv))
    for op, label in meta_ops:
        r = _r(groups, f"{big}/{op}", label)
        # the import-click row of the same table ran in the same rounds: the fairest reference
        click_r = _r(groups, f"{big}/{op}", "python3 -c 'import click'") or click_r
        if r and click_r:
            ratio = r.wall / click_r.wall
            out.append(Goal(f"{label} ({big}): <= 2x `python3 -c 'import click'`{note}", ratio <= 2.0,
                            f"{fmt_s(r.wall)} s vs {fmt_s(click_r.wall)} s ({ratio:.2f}x)", r.cmd.argv))
        if r:
            out.append(Goal(f"{label} ({big}): <= 60 MB peak memory{note}", r.peak <= 60e6,
                            f"{r.peak / 1e6:.0f} MB", r.cmd.argv))
    for op, label in meta_ops:
        r = _r(groups, f"small-200k/{op}", label)
        if r:
            out.append(Goal(f"{label} (200,000 tensors): <= 2 s", r.wall <= 2.0,
                            f"{fmt_s(r.wall)} s{_beside(groups, f'small-200k/{op}')}", r.cmd.argv))
    largest = _largest_tensor(big)
    for label in ("ckpt diff --values .pth -near.safetensors", "ckpt gate .pth -near.safetensors (NaN check)"):
        r = _r(groups, f"{big}/values", label)
        cat = _r(groups, f"{big}/values", "cat .pth -near.safetensors > /dev/null")
        if r and cat:
            share = cat.wall / r.wall
            out.append(Goal(f"{label} ({big} pair): >= 70% of cat throughput{note}", share >= 0.70,
                            f"{r.cmd.read_bytes / r.wall / 1e9:.2f} GB/s vs cat {cat.cmd.read_bytes / cat.wall / 1e9:.2f}"
                            f" GB/s ({share:.0%})", r.cmd.argv))
            limit = 2 * largest + 150 * MIB
            out.append(Goal(f"{label} ({big} pair): peak memory <= 2 x largest tensor + 150 MiB", r.peak <= limit,
                            f"{r.peak / MIB:.0f} MiB, limit {limit / MIB:.0f} MiB "
                            f"(largest tensor {largest / MIB:.0f} MiB)", r.cmd.argv))
    r = _r(groups, f"{big}/values", DIFF_HTML)
    cat = _r(groups, f"{big}/values", "cat .pth -near.safetensors > /dev/null")
    plain = _r(groups, f"{big}/values", "ckpt diff --values .pth -near.safetensors")
    if r and cat and plain:  # measured beside cat and diff --values (issue 25); no goal set yet
        out.append(Goal(f"{DIFF_HTML} ({big} pair): throughput beside cat and diff --values{note}", None,
                        f"{r.cmd.read_bytes / r.wall / 1e9:.2f} GB/s ({cat.wall / r.wall:.0%} of cat, "
                        f"{plain.wall / r.wall:.0%} of diff --values), {r.peak / MIB:.0f} MiB", r.cmd.argv))
    for label in ("ckpt migrate .pth -> .safetensors --strip-prefix model.",
                  "ckpt migrate .pth -> sharded/ --max-shard-size 1GB --strip-prefix model."):
        for name in [n for n in inputs if n.startswith("lm-")]:
            r = _r(groups, f"{name}/migrate", label)
            cp = _r(groups, f"{name}/migrate", "cp .pth")
            cps = _r(groups, f"{name}/migrate", "cp .pth && sync (fsync the copy)")
            if r and cp:
                ratio = r.wall / cp.wall
                synced = f"; {r.wall / cps.wall:.2f}x cp + fsync ({fmt_s(cps.wall)} s)" if cps else ""
                out.append(Goal(f"{label} ({name}): <= 2.5x cp", ratio <= 2.5,
                                f"{fmt_s(r.wall)} s vs cp {fmt_s(cp.wall)} s ({ratio:.2f}x){synced}", r.cmd.argv))
                lt = _largest_tensor(name)
                limit = lt + 150 * MIB
                out.append(Goal(f"{label} ({name}): peak memory <= largest tensor + 150 MiB", r.peak <= limit,
                                f"{r.peak / MIB:.0f} MiB, limit {limit / MIB:.0f} MiB", r.cmd.argv))
        r = _r(groups, "small-200k/migrate", label)
        if r:
            out.append(Goal(f"{label} (200,000 tensors): <= 5 s", r.wall <= 5.0,
                            f"{fmt_s(r.wall)} s{_beside(groups, 'small-200k/migrate')}", r.cmd.argv))
    for name in inputs:
        r = _r(groups, f"{name}/scan", "ckpt scan .pth")
        ps = _r(groups, f"{name}/scan", "picklescan -p .pth")
        if r and ps:
            out.append(Goal(f"ckpt scan .pth ({name}): faster than picklescan", r.wall < ps.wall,
                            f"{fmt_s(r.wall)} s vs {fmt_s(ps.wall)} s ({r.wall / ps.wall:.2f}x)", r.cmd.argv))
    return out


def _largest_tensor(name: str) -> int:
    if name.startswith("lm-"):
        return generate.largest_tensor_bytes({"lm-1g": 1, "lm-4g": 4}[name] * generate.GIB)
    return 64


def profile(argv: list[str], env: dict[str, str], top: int = 14) -> list[str]:
    """cProfile of one ckpt run: the functions where the time goes (self time)."""
    if argv[:3] != [PY, "-m", "ckpt_tool"]:
        return []
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "prof")
        args = list(argv[3:])
        outs = [a for i, a in enumerate(args) if i and args[i - 1] == "-o"]
        for o in outs:
            _remove(o)
        # main(argv) returns (as a program, `python -m ckpt_tool` ends with os._exit and the profiler
        # would never write its file)
        runner = os.path.join(tmp, "run_ckpt.py")
        with open(runner, "w") as f:
            f.write("import sys\nfrom ckpt_tool.cli import main\nsys.exit(main(sys.argv[1:]))\n")
        subprocess.run([PY, "-m", "cProfile", "-o", prof, runner, *args], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        for o in outs:
            _remove(o)
        if not os.path.exists(prof):
            return ["(profile failed)"]
        stats = pstats.Stats(prof)
        total = stats.total_tt  # type: ignore[attr-defined]
        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
        lines = [f"cProfile of `ckpt {' '.join(os.path.basename(a) for a in args)}` "
                 f"(total {total:.2f} s under the profiler; self time):", "", "```"]
        for (file, line, func), (_, ncalls, tt, ct, _) in rows:
            where = f"{os.path.relpath(file, ROOT) if file.startswith(ROOT) else os.path.basename(file)}:{line}"
            lines.append(f"{tt:7.3f} s self {ct:7.3f} s cum {ncalls:>8} calls  {func}  ({where})")
        lines += ["```", ""]
        return lines


def write_results(path: str, groups: list[Group], goal_list: list[Goal], quick: bool, load: tuple[str, str],
                  env: dict[str, str], wall: float, missing: list[str], profiles: bool) -> None:
    lines = ["# ckpt benchmark results", "",
             f"Written by `python3 benchmarks/run.py{' --quick' if quick else ''}` "
             f"in {wall / 60:.1f} min. Do not edit by hand: rerun it.", "", "## Machine", ""]
    lines += machine()
    lines += [f"- load average at start / end: {load[0]} / {load[1]}", ""]
    lines += ["Wall time and peak memory are medians over whole processes (peak RSS of each process alone). "
              "Bold rows are ckpt; the others are baselines run in the same rounds. "
              "`time / best baseline` divides by the fastest baseline of the table. "
              "Inputs were in the page cache (warm), as were the baselines' — `cat` shows the read limit.", ""]
    if missing:
        lines += [f"Not measured (command not in this checkout yet): {', '.join(sorted(missing))}.", ""]
    lines += ["What dominates a missed goal and what would close it: docs/performance.md (Known limits).", ""]
    lines += ["## Goals (issue 7)", ""]
    for g in goal_list:
        mark = "PASS" if g.passed else ("FAIL" if g.passed is False else "measured")
        lines.append(f"- **{mark}** {g.text}: {g.detail}")
    lines.append("")
    lines += ["## Results", ""]
    for g in groups:
        lines += table(g)
    failed = [g for g in goal_list if g.passed is False and g.profile_cmd]
    if failed and profiles:
        lines += ["## Where the time goes in missed goals", ""]
        seen: set[tuple[str, ...]] = set()
        for g in failed:
            key = tuple(g.profile_cmd or [])
            if key in seen:
                continue
            seen.add(key)
            lines += [f"**{g.text}** — {g.detail}", ""]
            lines += profile(g.profile_cmd or [], env)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("CKPT_DEBUG", None)
    # Measured as installed: pip compiles bytecode at install time. A checkout run with
    # PYTHONDONTWRITEBYTECODE (set on these machines) would compile every ckpt module on
    # every run, 30-60 ms that click, picklescan and torch (installed) never pay.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Benchmark ckpt against the baselines (issue 7).")
    ap.add_argument("--quick", action="store_true", help="1 GiB and 200k-tensor inputs only (a few minutes)")
    ap.add_argument("--runs", type=int, default=None,
                    help="counted runs of each metadata command (default 5; --quick: 3)")
    ap.add_argument("--data-runs", type=int, default=None,
                    help="counted runs of each data command (default 3; --quick: 2)")
    ap.add_argument("--data", default=generate.DEFAULT_DATA, help="inputs folder (default benchmarks/data)")
    ap.add_argument("--only", default="", help="run only groups whose key contains this (e.g. small-200k/inspect)")
    ap.add_argument("--output", default=None,
                    help="where to write the results (default benchmarks/RESULTS.md; --quick: "
                         "benchmarks/data/RESULTS-quick.md, so a quick run never replaces the full figures)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile of commands that miss a goal")
    ap.add_argument("--previous", default="", metavar="REV",
                    help="also time inspect and scan of each .pth by the checkout of REV (e.g. HEAD~3), in the "
                         "same rounds as this one: 'no slower than before' is judged on that table")
    args = ap.parse_args(argv)
    if args.quick:
        SETTINGS.update(slow_runs=1, quick=True)
    if args.output is None:
        args.output = os.path.join(args.data, "RESULTS-quick.md") if args.quick else os.path.join(HERE, "RESULTS.md")
    if args.runs is None:
        args.runs = 3 if args.quick else 5
    if args.data_runs is None:
        args.data_runs = 2 if args.quick else 3

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    need = (6 if args.quick else 26) << 30
    os.makedirs(args.data, exist_ok=True)
    free = shutil.disk_usage(args.data).free
    present = fsize(args.data)
    if free + present < need:
        log(f"need about {need >> 30} GiB free in {args.data}, have {free >> 30} GiB")
        return 2
    t0 = time.perf_counter()
    load0 = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    log("generating inputs (reused when present)...")
    # in a child process: this one stays small (see run_once) and never imports torch
    subprocess.run([PY, os.path.join(HERE, "generate.py"), "--data", args.data] + (["--quick"] if args.quick else []),
                   check=True, stdout=subprocess.DEVNULL)
    names = ["small-200k", "lm-1g"] + ([] if args.quick else ["lm-4g"])
    inputs = {n: os.path.join(args.data, n) for n in names}
    order = ["lm-1g", "lm-4g", "small-200k"]
    inputs = {k: inputs[k] for k in order if k in inputs}
    env = child_env()
    subprocess.run([PY, "-m", "compileall", "-q", os.path.join(ROOT, "ckpt_tool")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    have_cmds = ckpt_commands()
    missing = [c for c in ("inspect", "diff", "migrate", "gate", "scan") if c not in have_cmds]
    work = os.path.join(args.data, "work")
    os.makedirs(work, exist_ok=True)
    groups = plan(inputs, work, have_cmds, args.runs, args.data_runs)
    if args.previous:
        groups += previous_groups(inputs, args.previous, previous_tree(args.previous, args.data), args.runs)
    if args.only:
        groups = [g for g in groups if args.only in g.key or g.key == "startup"]
    for g in groups:
        log(f"{g.key}: {g.title}")
        measure(g, env, log)
    load1 = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    by_key = {g.key: g for g in groups}
    goal_list = goals(by_key, inputs, args.quick)
    for g in goal_list:
        log(f"{'PASS' if g.passed else 'FAIL' if g.passed is False else 'MEASURED'} {g.text}: {g.detail}")
    write_results(args.output, groups, goal_list, args.quick, (load0, load1), env, time.perf_counter() - t0,
                  missing, not args.no_profile)
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {os.path.relpath(args.output)} in {(time.perf_counter() - t0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
