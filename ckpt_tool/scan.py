"""Static pickle scanning: list every global a pickle references, never executing it."""
from __future__ import annotations

import pickletools
from dataclasses import dataclass, field

from . import security
from .model import GlobalRef


@dataclass
class PickleScan:
    where: str
    globals: list[GlobalRef] = field(default_factory=list)
    error: str | None = None

    @property
    def verdict(self) -> str:
        worst = security.worst([g.severity for g in self.globals])
        if self.error and worst != security.DANGEROUS:
            return security.DANGEROUS if any(g.module == "?" for g in self.globals) else worst
        return worst


def scan_pickle_bytes(data: bytes, where: str) -> PickleScan:
    """Walk the opcodes of one pickle and resolve the globals it names."""
    result = PickleScan(where)
    seen: set[tuple[str, str]] = set()
    strings: list[str | None] = []  # recent string pushes, to resolve STACK_GLOBAL
    memo: dict[int, str | None] = {}

    def add(module: str, name: str) -> None:
        if (module, name) in seen:
            return
        seen.add((module, name))
        sev = security.DANGEROUS if module == "?" else security.severity(module, name)
        result.globals.append(GlobalRef(module, name, sev, where))

    try:
        for op, arg, _pos in pickletools.genops(data):
            code = op.name
            if code in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                add(module, name)
                strings.append(None)
            elif code in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
                          "BINSTRING", "SHORT_BINSTRING"):
                strings.append(str(arg))
            elif code in ("MEMOIZE",):
                memo[len(memo)] = strings[-1] if strings else None
            elif code in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg)] = strings[-1] if strings else None
            elif code in ("GET", "BINGET", "LONG_BINGET"):
                strings.append(memo.get(int(arg)))
            elif code == "STACK_GLOBAL":
                name = strings[-1] if strings else None
                module = strings[-2] if len(strings) > 1 else None
                if isinstance(module, str) and isinstance(name, str):
                    add(module, name)
                else:
                    add("?", "?")
                strings.append(None)
            elif code == "STOP":
                break
            else:
                strings.append(None)
            if len(strings) > 64:
                del strings[:32]
    except Exception as exc:  # noqa: BLE001 - any parse failure is reported as a finding, not raised
        result.error = f"unparseable pickle: {exc}"
    return result
