"""Record the ``--json`` output of every command over the fixtures and the hostile corpus (issue 33).

A refactor must not change what the commands say: run this once on the
commit before the change and once after, over the same inputs, and compare::

    python tools/json_snapshot.py inputs /tmp/golden/in          # fixtures + corpus, written once
    python tools/json_snapshot.py run /tmp/golden/in before.jsonl  # on the old commit
    python tools/json_snapshot.py run /tmp/golden/in after.jsonl   # on the new one
    cmp before.jsonl after.jsonl

Each line is one command: its argv, exit code, stdout (the JSON
document) and stderr. Everything runs in one interpreter through ``ckpt_tool.cli.main``;
outputs of real migrations go to a fresh folder under the inputs, so paths
in the JSON are the same in both runs.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# pairs of fixtures for diff (A, B, extra options)
DIFF_PAIRS = [
    ("tiny_mlp.pth", "tiny_mlp.safetensors", ()),
    ("tiny_mlp.pth", "tiny_mlp.safetensors", ("--values",)),
    ("tiny_mlp_dp.pth", "tiny_mlp.pth", ()),
    ("tiny_mlp_dp.pth", "tiny_mlp.pth", ("--auto",)),
    ("tiny_mlp_dp.pth", "tiny_mlp.pth", ("--strip-prefix", "module.", "--values")),
    ("tiny_mlp_compiled.pth", "tiny_mlp.pth", ()),
    ("training.pth", "tiny_mlp.pth", ()),
    ("training.pth", "tiny_mlp.pth", ("--key", "model")),
    ("legacy.pth", "tiny_mlp.pth", ()),
    ("sharded", "tiny_mlp.safetensors", ()),
    ("sharded", "sharded_bin", ("--values", "--rollup-depth", "1")),
    ("dcp", "dcp_multi", ()),
    ("lightning.ckpt", "training.pth", ()),
    ("tiny_mlp.pth", "training.pth", ("--values", "--key-b", "model")),
]
TARGET = ("--target", "fixtures.models:TinyMLP")
_TIMING = re.compile(r'"seconds": [0-9.e-]+')


def make_inputs(folder: str) -> None:
    """Copy the fixtures and build the hostile corpus into ``folder`` (once: both runs read these bytes)."""
    if os.path.exists(folder):
        raise SystemExit(f"{folder} exists: the inputs are written once")
    shutil.copytree(os.path.join(HERE, "fixtures"), os.path.join(folder, "fixtures"))
    sys.path.insert(0, HERE)
    os.environ.setdefault("CKPT_CORPUS_LIBRARIES", "1")
    from tests.hostile.generate import build

    cases = build(os.path.join(folder, "corpus"))
    with open(os.path.join(folder, "cases.json"), "w") as f:
        json.dump([c.path for c in cases if c.kind != "special"], f, indent=0)


def _run(argv: list[str]) -> tuple[int, str, str]:
    from ckpt_tool.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    out.flush()
    err.flush()
    return code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]


def commands(folder: str) -> list[list[str]]:
    fx = os.path.join(folder, "fixtures")
    outs = os.path.join(folder, "out")
    entries = sorted(n for n in os.listdir(fx) if not n.endswith(".py") and n != "__pycache__")
    entries += sorted(os.path.join(n, m) for n in entries if os.path.isdir(os.path.join(fx, n))
                      for m in os.listdir(os.path.join(fx, n)) if m != "__pycache__")
    cmds: list[list[str]] = [["doctor", "--json"]]
    for n in entries:
        p = os.path.join(fx, n)
        cmds += [["inspect", "--json", p], ["scan", "--json", p], ["gate", "--json", p],
                 ["gate", "--json", "--strict", *TARGET, p], ["diff", "--json", p, *TARGET],
                 ["migrate", "--json", p, "-o", os.path.join(outs, n.replace("/", "_") + ".safetensors"), "--dry-run"],
                 ["migrate", "--json", "-q", p, "-o", os.path.join(outs, n.replace("/", "_") + ".safetensors")],
                 ["migrate", "--json", "-q", p, "-o", os.path.join(outs, n.replace("/", "_") + ".bf16.pth"),
                  "--dtype", "bf16"]]
    for a, b, extra in DIFF_PAIRS:
        cmds.append(["diff", "--json", os.path.join(fx, a), os.path.join(fx, b), *extra])
    with open(os.path.join(folder, "cases.json")) as f:
        for p in json.load(f):
            cmds += [["inspect", "--json", p], ["scan", "--json", p], ["gate", "--json", p]]
    return cmds


def run(folder: str, dest: str) -> None:
    sys.path.insert(0, folder)  # --target fixtures.models:TinyMLP
    outs = os.path.join(folder, "out")
    shutil.rmtree(outs, ignore_errors=True)
    os.makedirs(outs)
    with open(dest, "w") as f:
        for argv in commands(folder):
            code, text, err = _run(argv)
            text = _TIMING.sub(r'"seconds": 0', text)  # doctor's timings are not the output's meaning
            f.write(json.dumps({"argv": argv, "exit": code, "stdout": text, "stderr": err}, sort_keys=True) + "\n")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "inputs":
        make_inputs(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
