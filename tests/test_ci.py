"""CI runs exactly the README's test command, and that command lints the tests as well as the package."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _command(text: str) -> str:
    return next(line.strip() for line in text.splitlines()
                if line.startswith("python3 -m venv .venv") and "pytest" in line)


def test_ci_runs_the_readme_command_and_lints_the_tests():
    ci = _command((ROOT / ".ci" / "run").read_text())
    assert ci == _command((ROOT / "README.md").read_text())
    assert "ruff check ckpt_tool tests &&" in ci and "mypy --strict ckpt_tool" in ci


def test_the_ruff_configuration_keeps_the_limits():
    """Complexity at most 15, at most 12 arguments (click commands exempt), for the package and the tests."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert lint["mccabe"]["max-complexity"] == 15 and lint["pylint"]["max-args"] == 12
    assert {"C901", "PLR0913"} <= set(lint["select"])
    assert lint["per-file-ignores"] == {"ckpt_tool/cli/*_cmd.py": ["PLR0913"]}
