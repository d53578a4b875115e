"""Makes the modules named in $STOKER_BLOCK_IMPORTS (comma-separated top-level
names) fail to import, in every Python process that has this folder on its
path: `scripts/gpu-check` puts it on PYTHONPATH so that its parts, their
pytest and their ranks run as on the GPU machine, where mlflow, av, soundfile
and submitit are not installed. Python imports `sitecustomize` at start-up."""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from types import ModuleType

BLOCKED = frozenset(
    name.strip() for name in os.environ.get("STOKER_BLOCK_IMPORTS", "").split(",") if name.strip()
)


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (blocked by STOKER_BLOCK_IMPORTS: the GPU "
                "machine does not have it)",
                name=fullname,
            )
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocked())
