"""inspect against a bare ``import click`` (issue 33): start-up cost, measured so noise cannot decide it.

A metadata answer's floor is the interpreter and click; what ckpt imports on top is its own cost. Each round
runs, in an order that rotates from round to round, ``python3 -c 'import click'``, ``ckpt inspect`` of the
1 GiB ``.pth`` and of the 1 GiB ``.safetensors`` (benchmarks/generate.py's ``lm-1g``), and with
``--previous REV`` the same two inspects by REV's checkout (started the same way: ``python3 -m ckpt_tool``
with that tree first on the path). The goal is judged on the median of the per-round ratios inspect / click
(at most 1.4x); the machine's load average is recorded at the start and the end. ckpt runs as installed:
bytecode compiled first and written by the children (see README.md). Also counted: the modules each
command imports (``-X importtime``), ckpt's own and all.

    python3 benchmarks/imports.py                     # 31 rounds, writes benchmarks/RESULTS-import.md
    python3 benchmarks/imports.py --rounds 11 --previous 4e53d48
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
GOAL = 1.4


@dataclass
class Cmd:
    label: str
    argv: list[str]
    env: dict[str, str]
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + system seconds of the child: less swayed by load


def child_env(tree: str) -> dict[str, str]:
    """The tree's ckpt first on the path (the commands also run in it: ``-m`` puts the working folder first)."""
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode written once, then read
    return env


def run_once(cmd: Cmd) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(cmd.argv, env=cmd.env, cwd=cmd.env["PYTHONPATH"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{cmd.label} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def modules(cmd: Cmd) -> tuple[int, int]:
    """(ckpt's modules, all modules) the command imports, from ``-X importtime``."""
    r = subprocess.run([cmd.argv[0], "-X", "importtime", *cmd.argv[1:]], env=cmd.env, cwd=cmd.env["PYTHONPATH"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    names = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    names = [n for n in names if n != "package"]
    return sum(1 for n in names if n.split(".")[0] == "ckpt_tool"), len(names)


def per_round(a: Cmd, b: Cmd, cpu: bool = False) -> float:
    mine, theirs = (a.cpu, b.cpu) if cpu else (a.times, b.times)
    return statistics.median(x / y for x, y in zip(mine, theirs, strict=True) if y > 0)


def previous_tree(rev: str, work: str) -> str:
    tree = os.path.join(work, "previous")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "ckpt_tool"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--data", default=os.path.join(HERE, "data"))
    parser.add_argument("--previous", metavar="REV", help="also time REV's inspect in the same rounds")
    parser.add_argument("--output", default=os.path.join(HERE, "RESULTS-import.md"))
    args = parser.parse_args(argv)
    sys.path.insert(0, HERE)
    import generate

    generate.generate_lm(args.data, "lm-1g", generate.GIB, sharded=False)
    pth, st = (os.path.join(args.data, f"lm-1g.{ext}") for ext in ("pth", "safetensors"))
    env = child_env(ROOT)
    subprocess.run([PY, "-m", "compileall", "-q", os.path.join(ROOT, "ckpt_tool")], env=env, check=True)
    with tempfile.TemporaryDirectory(prefix="imports-") as work:
        cmds = [Cmd("python3 -c 'import click'", [PY, "-c", "import click"], env),
                Cmd("ckpt inspect lm-1g.pth", [PY, "-m", "ckpt_tool", "inspect", pth], env),
                Cmd("ckpt inspect lm-1g.safetensors", [PY, "-m", "ckpt_tool", "inspect", st], env)]
        if args.previous:
            old = child_env(previous_tree(args.previous, work))
            subprocess.run([PY, "-m", "compileall", "-q", old["PYTHONPATH"]], env=old, check=True)
            cmds += [Cmd(f"{args.previous}: ckpt inspect lm-1g.pth", [PY, "-m", "ckpt_tool", "inspect", pth], old),
                     Cmd(f"{args.previous}: ckpt inspect lm-1g.safetensors",
                         [PY, "-m", "ckpt_tool", "inspect", st], old)]
        load0 = os.getloadavg()
        for c in cmds:  # warm-up: page cache and bytecode
            run_once(c)
        for i in range(args.rounds):
            for c in cmds[i % len(cmds):] + cmds[:i % len(cmds)]:
                wall, cpu = run_once(c)
                c.times.append(wall)
                c.cpu.append(cpu)
        load1 = os.getloadavg()
        counts = [modules(c) for c in cmds]
    text = report(cmds, counts, load0, load1, args)
    with open(args.output, "w") as f:
        f.write(text)
    print(text)
    return 0


def report(cmds: list[Cmd], counts: list[tuple[int, int]], load0: tuple[float, ...], load1: tuple[float, ...],
           args: argparse.Namespace) -> str:
    click = cmds[0]
    fmt = " / ".join
    out = ["# inspect against `import click` (benchmarks/imports.py)", "",
           f"{args.rounds} rounds after a warm-up, the commands' order rotating each round; {os.cpu_count()} cores; "
           f"python {sys.version.split()[0]}; load average (1, 5, 15 min) {fmt(f'{x:.2f}' for x in load0)} at the "
           f"start, {fmt(f'{x:.2f}' for x in load1)} at the end (other jobs share the machine).", "",
           "| command | median (ms) | fastest (ms) | x import click (median of per-round ratios) | "
           "CPU time, median (ms) | CPU x import click (per round) | ckpt modules imported | all modules imported |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c, (mine, total) in zip(cmds, counts, strict=True):
        out.append(f"| {c.label} | {statistics.median(c.times) * 1e3:.0f} | {min(c.times) * 1e3:.0f} | "
                   f"{per_round(c, click):.2f} | {statistics.median(c.cpu) * 1e3:.0f} | "
                   f"{per_round(c, click, cpu=True):.2f} | {mine} | {total} |")
    out += ["", "## Goal", "", "```"]
    for c in cmds[1:3]:
        ratio = per_round(c, click)
        out.append(f"{'PASS' if ratio <= GOAL else 'FAIL'}  {c.label}: {ratio:.2f}x `python3 -c 'import click'` "
                   f"(median of {len(c.times)} per-round ratios of wall time; goal <= {GOAL}x); CPU time "
                   f"{per_round(c, click, cpu=True):.2f}x")
    out += ["```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
