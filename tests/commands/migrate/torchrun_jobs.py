"""Several ``ckpt migrate`` commands run one after another in each torchrun rank, in one launch.

    python -m torch.distributed.run --nproc-per-node 2 tests/commands/migrate/torchrun_jobs.py OUT JOBS_JSON

JOBS_JSON is a list of ``[name, arg, ...]``: each rank runs ``ckpt migrate
ARGS`` through the CLI's ``main`` (what ``-m ckpt_tool migrate`` runs) and
leaves its stdout in ``OUT/NAME.RANK.out`` and its exit code in
``OUT/NAME.RANK.rc``. Starting torchrun and torch costs seconds a launch; the
ranks' process group is made by the first migrate and reused by the next,
so a test of many layouts pays for one start.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def main() -> int:
    from ckpt_tool.cli import main as ckpt

    out, jobs = sys.argv[1], json.loads(sys.argv[2])
    rank = os.environ["RANK"]
    for name, *args in jobs:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = ckpt(["migrate", *args])
        with open(os.path.join(out, f"{name}.{rank}.out"), "w", encoding="utf-8") as f:
            f.write(printed.getvalue())
        with open(os.path.join(out, f"{name}.{rank}.rc"), "w", encoding="utf-8") as f:
            f.write(str(code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
