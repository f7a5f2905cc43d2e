"""List what outgrows the house's limits: functions over 60 lines (``def`` line to the last
line, docstring included) and modules over 400 lines, under src/ (or the folder given).

    python3 scripts/long_code.py [FOLDER]

Prints one line per function or module over its limit and exits 1 when there is any.
"""

from __future__ import annotations

import ast
import pathlib
import sys

FUNCTION_LINES = 60
MODULE_LINES = 400


def main(folder: str) -> int:
    found = 0
    for path in sorted(pathlib.Path(folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MODULE_LINES:
            found += 1
            print(f"module {path}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found += 1
                    print(f"function {path}:{node.lineno} {node.name}: {length} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "src"))
