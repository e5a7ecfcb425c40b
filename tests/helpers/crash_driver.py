"""Run ``ckpt ARGS`` and signal it at a named point of migrate's progress (test harness only).

    python tests/helpers/crash_driver.py POINT SIGNAL EVENTS_FILE -- migrate SRC -o OUT ...

Points are the progress events migrate reports, numbered per stage:
``writing:start``, ``writing:advance:3``, ``writing:done``,
``verifying:start``, ``verifying:advance:1``, ``verifying:done``, ...
POINT ``record`` kills nothing and writes every event to EVENTS_FILE, one a
line, so a test can pick points across the whole run. The process sends
SIGNAL (SIGKILL, SIGINT, SIGTERM) to itself at the point, once: SIGKILL
ends it on the spot (no cleanup can run), the others go through ckpt's
interrupt handling. SIGNAL ``PAUSE:FILE`` instead waits at the point until
FILE exists (after creating FILE.paused), to line two runs up on purpose.
Nothing in ckpt is changed: the CLI's progress-bar class is swapped for
this one before main() runs.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckpt_tool.cli import (
    main,
    migrate_cmd,
)


def run(point: str, sig_name: str, events_file: str, argv: list[str]) -> int:
    fired = [False]
    events = open(events_file, "a", encoding="utf-8") if point == "record" else None  # noqa: SIM115 - kept open for the run

    class Killer:
        def __init__(self, enabled: bool) -> None:
            self.label = ""
            self.count = 0

        def hit(self, name: str) -> None:
            if events is not None:
                events.write(name + "\n")
                events.flush()
            elif name == point and not fired[0]:
                fired[0] = True
                if sig_name.startswith("PAUSE:"):  # wait here until the test creates this file
                    go = sig_name[len("PAUSE:"):]
                    Path(go + ".paused").touch()
                    deadline = time.monotonic() + 120
                    while not os.path.exists(go) and time.monotonic() < deadline:
                        time.sleep(0.01)
                else:
                    os.kill(os.getpid(), getattr(signal, sig_name))

        def start(self, label: str, total: int) -> None:
            self.label, self.count = label, 0
            self.hit(f"{label}:start")

        def advance(self, n: int) -> None:
            self.count += 1
            self.hit(f"{self.label}:advance:{self.count}")

        def done(self) -> None:
            if self.label:
                self.hit(f"{self.label}:done")
                self.label = ""

    # migrate's progress (cli/progress.py's adapter) replaced by the killer: each step is a crash point
    migrate_cmd.progress_bars = lambda **_: Killer(True)  # type: ignore[assignment]
    return main(argv)


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(run(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[sep + 1:]))
