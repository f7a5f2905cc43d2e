"""The README's "How it is built" table is the package's map: every folder and top-level module
is in it, and no module imports a subsystem listed above its own (lazy imports count too)."""

from __future__ import annotations

import ast
import os
import re

import kernelcache

SRC = os.path.dirname(kernelcache.__file__)
README = os.path.join(os.path.dirname(os.path.dirname(SRC)), "README.md")
TOP = ("__init__", "__main__")  # gather the public names: above every subsystem


def _rows() -> list[set[str]]:
    """The table's rows, top to bottom: the top-level folder or module each first cell names."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## How it is built", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cell = line.split("|")[1] if line.startswith("| `") else ""
        names = {re.split(r"[/.]", name)[0] for name in re.findall(r"`([^`]+)`", cell)}
        if names:
            rows.append(names)
    return rows


def _level() -> dict[str, int]:
    level = {name: 0 for name in TOP}
    for i, names in enumerate(_rows(), start=1):
        for name in names:
            level.setdefault(name, i)  # stores/ and stores/file/ are one subsystem: its first row
    return level


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level part of kernelcache) for every absolute import of kernelcache in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "kernelcache":
                found += [(node.lineno, a.name) for a in node.names]
            elif node.module.startswith("kernelcache."):
                found.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("kernelcache.")]
    return found


def test_every_folder_and_top_level_module_is_in_the_map() -> None:
    present = {name.removesuffix(".py") for name in os.listdir(SRC) if name.endswith(".py") or "." not in name}
    present -= {"__pycache__"}
    assert present - set(_level()) == set()


def test_no_module_imports_a_subsystem_listed_above_its_own() -> None:
    level = _level()
    climbs = []
    for folder, _dirs, files in os.walk(SRC):
        for file in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            me = os.path.relpath(path, SRC).split(os.sep)[0].removesuffix(".py")
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for line, them in _imported(tree):
                if them != me and them in level and level[them] < level[me]:
                    climbs.append(f"{os.path.relpath(path, SRC)}:{line} imports kernelcache.{them}")
    assert climbs == []
