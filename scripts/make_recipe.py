"""Run one target's recipe from the Makefile, for a machine without ``make`` (minimal Debian/Ubuntu images).

scripts/test.sh uses it, so ``make test`` and ``scripts/test.sh`` run the same command, written once,
in the Makefile. Only what this project's Makefile uses is understood: ``NAME ?= value``,
``NAME := value`` and ``NAME = value`` (the environment overrides ``?=``, as with make), ``$(NAME)``
expanded recursively, and a target's tab-indented recipe lines. Prerequisites are not run: the
caller installs first. Extra arguments are appended to the recipe's last line (pytest's options).

Usage: python scripts/make_recipe.py TARGET [ARG...]
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|=)\s*(.*)$")
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def read_makefile(text: str, environ: dict[str, str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """``(variables, recipes)`` of the Makefile ``text``; ``?=`` variables take ``environ``'s value."""
    variables: dict[str, str] = {}
    recipes: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if current is not None:
                current.append(line[1:])
            continue
        current = None
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assigned = ASSIGNMENT.match(line)
        if assigned:
            name, op, value = assigned.groups()
            variables[name] = environ[name] if op == "?=" and name in environ else value.strip()
            continue
        target, colon, _ = line.partition(":")
        if colon and not target.startswith(".") and " " not in target.strip():
            current = recipes.setdefault(target.strip(), [])
    return variables, recipes


def expand(text: str, variables: dict[str, str], depth: int = 0) -> str:
    if depth > 10:
        raise ValueError(f"Makefile variables refer to each other in a loop: {text}")
    expanded = REFERENCE.sub(lambda m: variables.get(m[1], os.environ.get(m[1], "")), text)
    return expanded if expanded == text else expand(expanded, variables, depth + 1)


def recipe(target: str, extra: list[str], text: str, environ: dict[str, str]) -> list[str]:
    """The shell lines ``make TARGET`` would run (without its prerequisites), ``extra`` on the last."""
    variables, recipes = read_makefile(text, environ)
    if target not in recipes or not recipes[target]:
        raise SystemExit(f"make_recipe.py: the Makefile has no recipe for {target!r} (targets: {', '.join(recipes)})")
    lines = [expand(line, variables).lstrip("@") for line in recipes[target]]
    if extra:
        lines[-1] += " " + shlex.join(extra)
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    for line in recipe(argv[0], argv[1:], MAKEFILE.read_text(), dict(os.environ)):
        print(f"+ {line}", flush=True)
        code = subprocess.run(["sh", "-c", line], cwd=MAKEFILE.parent).returncode
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
