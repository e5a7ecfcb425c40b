"""How the walk judges a global the pickle calls or constructs, or hands to a call: by allowlist.

A global outside the inert list (pickles/inert.py) that an opcode calls or
constructs, or that is passed to a call (an inert trampoline calls or
constructs its arguments), is dangerous; each distinct global is judged once
per pickle, so the 400,000 tensor rebuilds of a large file cost a set lookup.
"""
from __future__ import annotations

from ...model import GlobalRef
from .. import severity as levels
from ..inert import SHALLOW, TRAMPOLINES
from .state import WalkState
from .values import Container, Glob

FULL_UNPICKLE = "a full unpickle (torch.load with weights_only off, pickle.load)"
# What the verdict on an uncatalogued global says: unknown, so fail closed, but no exploit is claimed.
NOT_REVIEWED = "not reviewed by ckpt's catalog (docs/security.md); no known exploit is implied"
PERSISTENT_LOAD = ("torch.serialization", "persistent_load")  # how the messages name a persistent id's loader


class Judging(WalkState):
    """The walk's verdicts on calls: WalkState plus the allowlist rule."""

    def pass_args(self, callee: tuple[str, str] | None, args: tuple[object, ...] | list[object], depth: int) -> None:
        """Judge each global among a call's arguments as called: the callee may call or construct it.

        ``copyreg._reconstructor(cls, ...)``, ``defaultdict(factory)``,
        ``_rebuild_from_type_v2(func, type, args, ...)`` are inert only as long
        as what they are handed is. Tuples nest (``_rebuild_from_type_v2``'s
        args are applied); the tensor rebuilds' tuples are sizes and strides.
        """
        deep = depth < 6 and callee not in SHALLOW
        called = self.called
        for a in args:
            cls = a.__class__
            if cls is Glob:
                if (a.module, a.name) not in called:  # type: ignore[attr-defined]  # cls is Glob
                    self.judge_arg(a, callee)  # type: ignore[arg-type]
            elif cls is tuple and deep:
                self.pass_args(callee, a, depth + 1)  # type: ignore[arg-type]  # cls is tuple
            elif cls is Container and a.globs and depth < 6:  # type: ignore[attr-defined]  # cls is Container
                self.pass_args(callee, a.globs, depth + 1)  # type: ignore[attr-defined]

    def slot_state(self, slots: Container) -> None:
        """BUILD's slot state is applied with setattr, key by key: ``{"__class__": X}`` makes the object an X,
        whose ``__del__`` and other methods then run. A global there is judged as constructed."""
        for g in slots.globs or ():
            if isinstance(g, Glob) and (g.module, g.name) not in self.called:
                self.called.add((g.module, g.name))
                self.judge((g.module, g.name), "BUILD's slot state sets {name} as an attribute with setattr "
                           "(as the object's __class__, its methods then run)")

    def judge_arg(self, arg: Glob, callee: tuple[str, str] | None) -> None:
        key = (arg.module, arg.name)
        if key in self.called:
            return
        self.called.add(key)
        if callee is None:
            how = "passes {name} to an object built at load time, which may call it"
        else:
            verb = TRAMPOLINES.get(callee, "may call or construct it")
            how = "passes {name} to " + f"{callee[0]}.{callee[1]}, which {verb}"
        self.judge(key, how)

    def judge(self, key: tuple[str, str], how: str) -> None:
        """A global outside the inert list that the pickle calls or constructs is dangerous: never merely "unknown".

        Judged once per distinct global. ``how`` is "calls", "constructs", or
        the sentence of a trampoline ("passes {name} to copyreg._reconstructor,
        which constructs it"). TorchScript's ``__torch__`` classes come from the
        archive's own code (the scanner judges them; Python has no such module).
        """
        index = next((i for i, g in enumerate(self.w.globals) if (g.module, g.name) == key), None)
        if index is None or self.w.globals[index].severity != levels.SUSPICIOUS:
            return
        if key[0].split(".", 1)[0] == "__torch__":
            return
        g = self.w.globals[index]
        self.w.globals[index] = GlobalRef(g.module, g.name, levels.DANGEROUS, g.where)
        name = f"{key[0]}.{key[1]}"
        if how in ("calls", "constructs"):
            runs = "run it" if how == "calls" else "run its class code (construction, __setstate__)"
            text = (f"{how} {name}, which is not on the inert allowlist ({NOT_REVIEWED}): {FULL_UNPICKLE} would "
                    f"import it and {runs}")
        else:
            passed = how.replace("{name}", name, 1)
            text = (f"{passed}; {name} is not on the inert allowlist ({NOT_REVIEWED}): {FULL_UNPICKLE} would import "
                    "it and run it")
        self.finding(levels.DANGEROUS, text, name)

