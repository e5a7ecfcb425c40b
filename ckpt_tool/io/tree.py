"""Walking a local folder for the commands that must see all of it (scan, gate, inspect).

Nothing unread is safe: a folder that cannot be listed, a file that cannot
be opened and a symbolic link that leads nowhere are recorded as unreadable,
never passed over in silence (``os.walk`` drops unreadable folders without
a word). Symbolic links, to folders and to files, are followed once and
recorded: a folder or file reached a second time by its real path (through
another link, or a link to one of its own parents) is not read again, so a
link loop ends and nothing is counted twice. Links are followed after the
folders themselves are walked, so a file is listed under its own path where
it has one, and under a link's path only when the link is the one way to it.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

FOLLOWED, ALREADY_READ, BROKEN = "followed", "already read", "broken"


@dataclass(frozen=True)
class Link:
    """A symbolic link met in the walk, and what the walk did with it."""

    path: str
    target: str  # its real path (for a broken link: where it points)
    kind: str  # "folder", "file", or "missing" (broken)
    action: str  # FOLLOWED, ALREADY_READ (reached before as ``first``), BROKEN
    first: str = ""

    def describe(self) -> str:
        if self.action == FOLLOWED:
            return f"followed the symbolic link {self.path} -> {self.target} ({self.kind})"
        if self.action == ALREADY_READ:
            return (f"did not follow the symbolic link {self.path} -> {self.target}: that {self.kind} is read "
                    f"once, as {self.first}")
        return f"the symbolic link {self.path} -> {self.target} leads nowhere"

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "target": self.target, "kind": self.kind, "action": self.action,
                "first": self.first}


@dataclass(frozen=True)
class Unreadable:
    """A folder or file the walk could not read: an error wherever it is met."""

    path: str
    kind: str  # "folder" or "file"
    reason: str

    @property
    def message(self) -> str:
        return f"{self.path}: {self.reason}; what it holds was not read, so it is not safe"


@dataclass
class Tree:
    """The readable folders of a walk (each with its file names, sorted), in walk order, and what was not."""

    root: str
    folders: list[tuple[str, list[str]]] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return [os.path.join(folder, n) for folder, names in self.folders for n in names]


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EACCES or isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)


def _broken(path: str) -> tuple[str, str]:
    """(where the link points, why it cannot be followed)."""
    try:
        points = os.readlink(path)
    except OSError:
        points = "?"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return points, "a symbolic link loop (it leads back to itself)"
        if exc.errno == errno.ENOENT:
            return points, f"a symbolic link to {points}, which does not exist"
        return points, f"a symbolic link that cannot be followed: {_reason(exc)}"
    return points, "a symbolic link that cannot be followed"


def _can_open(path: str) -> OSError | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return exc
    os.close(fd)
    return None


def walk(root: str, *, open_files: bool = False) -> Tree:
    """Every folder under ``root`` (itself included), depth first in name order, links followed once.

    The folders and files themselves come first, then what links lead to
    (so everything is listed by its own path where it has one under
    ``root``, and a link is followed only to what was not read yet).
    ``open_files`` also opens (and closes) each file, so that one that
    cannot be read is recorded; scan does not need it (it opens every file
    it scans and reports those it cannot).
    """
    tree = Tree(root)
    seen: dict[str, str] = {os.path.realpath(root): root}  # real path -> the path it is read as
    names_of: dict[str, list[str]] = {}
    links: list[tuple[str, str, bool]] = []  # (folder, name, to a folder), followed once the tree is walked
    stack = [root]
    while True:
        while stack:
            _visit(stack.pop(), tree, seen, names_of, links, stack, open_files)
        if not links:
            break
        folder, name, is_dir = links.pop(0)
        full = os.path.join(folder, name)
        real = os.path.realpath(full)
        kind = "folder" if is_dir else "file"
        if real in seen:
            tree.links.append(Link(full, real, kind, ALREADY_READ, seen[real]))
            continue
        seen[real] = full
        tree.links.append(Link(full, real, kind, FOLLOWED))
        if is_dir:
            stack.append(full)
        elif _readable(full, tree, open_files):
            names_of[folder].append(name)
            names_of[folder].sort()
    return tree


def _visit(folder: str, tree: Tree, seen: dict[str, str], names_of: dict[str, list[str]],
           links: list[tuple[str, str, bool]], stack: list[str], open_files: bool) -> None:
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        tree.unreadable.append(Unreadable(folder, "folder", f"cannot list this folder: {_reason(exc)}"))
        return
    real_folder = os.path.realpath(folder)
    names: list[str] = []
    subfolders: list[str] = []
    for entry in entries:
        full = os.path.join(folder, entry.name)
        try:
            is_dir = entry.is_dir()  # follows links
        except OSError:
            is_dir = False
        if entry.is_symlink():
            if not os.path.exists(full):
                points, why = _broken(full)
                tree.links.append(Link(full, points, "missing", BROKEN))
                tree.unreadable.append(Unreadable(full, "file", why))
            else:
                links.append((folder, entry.name, is_dir))
            continue
        real = os.path.realpath(full) if is_dir else os.path.join(real_folder, entry.name)
        if real in seen:  # reached by a link followed earlier (a folder walked from two roots)
            continue
        seen[real] = full
        if is_dir:
            subfolders.append(full)
        elif _readable(full, tree, open_files):
            names.append(entry.name)
    names_of[folder] = names
    tree.folders.append((folder, names))
    stack.extend(reversed(subfolders))


def _readable(path: str, tree: Tree, open_files: bool) -> bool:
    if not open_files:
        return True
    problem = _can_open(path)
    if problem is not None:
        tree.unreadable.append(Unreadable(path, "file", f"cannot open this file: {_reason(problem)}"))
        return False
    return True


def first_unreadable(root: str) -> Unreadable | None:
    """The first folder or file under ``root`` that cannot be read (None: every one can)."""
    problems = walk(root, open_files=True).unreadable
    return problems[0] if problems else None


__all__ = ["ALREADY_READ", "BROKEN", "FOLLOWED", "Link", "Tree", "Unreadable", "first_unreadable", "walk"]
