"""The paths users write keep working after code moves (issue [3/8]): each public name
at the path the README, the docs, the golden sbatch file or an experiment file gives,
and the object there is the one that does the work (a re-export, not a copy)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from stoker.import_path import import_callable
from stoker.protocol import PREFLIGHT_MODULE, TRAIN_MODULE

# (where a user names it, "module:attribute")
PUBLIC = [
    ("the golden sbatch file: python -m", "stoker.runtime.train:main"),
    ("README: encode.encoder", "stoker.data.tiny_encoder:build"),
    ("docs/data.md: the loader", "stoker.data.loader:StreamingLoader"),
    ("docs/data.md: the loader from a config", "stoker.data.loader:loader_from_config"),
    ("docs/bring-your-own.md: the model contract", "stoker.model:DataShapes"),
    ("docs/bring-your-own.md: the model contract", "stoker.model:valid_mean"),
    ("docs/bring-your-own.md: your own loop", "stoker.job:init"),
    ("docs/bring-your-own.md: your own loop", "stoker.job:Run"),
    ("docs/bring-your-own.md: your own loop", "stoker.job:Checkpoint"),
    ("docs/bring-your-own.md: your own loop", "stoker.job:JobLoader"),
    ("docs/kernels.md", "stoker.kernels:use_backend"),
    ("docs/kernels.md", "stoker.kernels:CrossEntropyLoss"),
    ("docs/runtime.md: the tracking logger", "stoker.tracking.logger:RunLogger"),
    ("README: the Python API", "stoker:submit"),
]


@pytest.mark.parametrize(("where", "path"), PUBLIC, ids=[p for _, p in PUBLIC])
def test_a_public_path_gives_the_object_that_does_the_work(where: str, path: str) -> None:
    module_name, _, name = path.partition(":")
    found: Any = getattr(importlib.import_module(module_name), name)
    home = getattr(found, "__module__", None)
    if home is not None and home != module_name:  # re-exported: the same object at home
        assert getattr(importlib.import_module(home), found.__name__) is found, (where, home)
    # As stoker resolves `model.arch` and `encode.encoder` (classes are callables too).
    assert import_callable(path, key="public path") is found


def test_the_modules_the_batch_script_and_the_launcher_start_exist() -> None:
    for module in (TRAIN_MODULE, PREFLIGHT_MODULE):
        assert callable(importlib.import_module(module).main), module
