"""Runs the ```python blocks of a Markdown file in order, in one namespace.

Used by ``test_readme.py`` in this process and, as a script, by the Python of a fresh
venv with nothing but the package installed: ``python readme_blocks.py README.md``.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Dict, List

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(markdown: str) -> List[str]:
    """The ```python blocks of a Markdown text."""
    return [m.group(1) for m in FENCE.finditer(markdown)]


def run(path: str) -> Dict[str, Any]:
    """Executes every block of the file at ``path``; returns the namespace."""
    with open(path, encoding="utf-8") as f:
        found = blocks(f.read())
    if not found:
        raise SystemExit(f"{path}: no python blocks")
    namespace: Dict[str, Any] = {"__name__": "__readme__"}
    for number, code in enumerate(found, 1):
        print(f"--- block {number} of {len(found)}", flush=True)
        exec(compile(code, f"{path}:block{number}", "exec"), namespace)
    return namespace


if __name__ == "__main__":
    run(sys.argv[1])
    print("--- all blocks ran", flush=True)
