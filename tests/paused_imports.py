"""Run a script as `python SCRIPT ARGS...` runs it, its imports made with Python's
collector paused, as stoker's own ranks import (stoker/process/gc_pause.py):

    python tests/paused_imports.py SCRIPT [ARGS...]

The imports at the head of SCRIPT (its `import` and `from ... import` lines before its
first other statement) are made first, with the collector paused, and what they made
frozen; then SCRIPT runs as `__main__`, its imports now found in sys.modules. The
suite's own rank scripts import torch, its distributed stack and stoker's runtime at
their head, as a training rank does: tests/local_ranks.py starts them through this.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import runpy
import sys
from pathlib import Path


def head_imports(script: Path) -> list[str]:
    """The absolute modules SCRIPT imports before its first other statement, in order."""
    tree = ast.parse(script.read_text(), str(script))
    names: list[str] = []
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if node.module not in (None, "__future__"):
                # `from a.b import c`: c may be a module of its own (a.b.c).
                names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            break
    return names


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)  # as `python SCRIPT` sets it
    from stoker.process.gc_pause import pause_collector, resume_collector

    pause_collector()
    try:
        for name in head_imports(script):
            parent, _, last = name.rpartition(".")
            if name in sys.modules or hasattr(sys.modules.get(parent), last):
                continue
            # `from a.b import c` of a name that is no module (a.b has it), or a module
            # that fails: the script's own import then fails the same way, and says so.
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    finally:
        resume_collector()
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
