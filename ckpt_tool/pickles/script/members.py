"""The code members of a TorchScript archive (``code/**.py``), read as text: what torch.jit.load compiles."""
from __future__ import annotations

from ...errors import CkptError
from ...io import Blob
from ...io.zip import Member, member_blob


def is_code(name: str) -> bool:
    return name.endswith(".py") and ("/code/" in name or name.startswith("code/"))


def read_code(blob: Blob, entries: list[Member], limit: int) -> tuple[dict[str, str], dict[str, str]]:
    """(text of each code member, error of each one that could not be read), by member name."""
    texts: dict[str, str] = {}
    errors: dict[str, str] = {}
    for e in entries:
        if not is_code(e.name):
            continue
        try:
            code = member_blob(blob, e, limit)
            texts[e.name] = code.read(0, code.length).decode("utf-8", "replace")
        except CkptError as exc:
            errors[e.name] = exc.message
    return texts, errors
