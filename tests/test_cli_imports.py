"""Login-node speed: `stoker --help` and every command's `--help` import none of the
heavy modules. Checked in a fresh interpreter with `-X importtime`, which lists every
module the process imported."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import typer

from stoker.cli.main import app

# The list, plus what would make --help slow without being needed for it.
HEAVY = {
    "torch",
    "triton",
    "mlflow",
    "submitit",
    "av",
    "soundfile",
    "numpy",
    "pandas",
    "pydantic",
    "jinja2",
    "fsspec",
    "yaml",
    # What crept into `stoker --help` with the data commands' `--json` output (a module
    # level `import json`), ~2 ms of a 100 ms budget; a command imports it when it prints.
    "json",
}


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    # typer vendors click: a group is whatever has sub-commands.
    for name, sub in (getattr(command, "commands", None) or {}).items():
        paths += command_paths(sub, (*prefix, name))
    return paths


ALL_COMMANDS = command_paths(typer.main.get_command(app))


def imported_modules(*args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "stoker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    modules = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip())
    return modules


def test_every_command_is_checked() -> None:
    assert ("init",) in ALL_COMMANDS and ("config", "show") in ALL_COMMANDS
    assert len(ALL_COMMANDS) >= 5


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "stoker")
def test_help_imports_no_heavy_module(path: tuple[str, ...]) -> None:
    modules = imported_modules(*path, "--help")
    assert "stoker.cli.main" in modules  # the parse saw the real import list
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`stoker {' '.join(path)} --help` imports {heavy[:10]}"


def test_the_guard_catches_a_heavy_import() -> None:
    # `config show` does import pydantic and yaml: the same parse must see them.
    modules = imported_modules("config", "show", "--json")
    assert {"pydantic", "yaml"} <= {m.split(".")[0] for m in modules}


# What a login node's Python may load to submit: the config's pydantic and yaml, the
# launcher's jinja2; never the training stack.
TRAINING_STACK = {"torch", "triton", "mlflow", "submitit", "av", "soundfile", "numpy"}


def test_import_stoker_and_its_python_api_load_no_training_stack() -> None:
    # The API's module and what its calls import (submit, status, logs, why, cancel).
    code = (
        "import stoker; stoker.submit; stoker.sweep; stoker.jobs; stoker.Job; "
        "import stoker.model, stoker.launcher.launch.sweep; "
        "import stoker.launcher.launch.submit, stoker.launcher.watch.status, "
        "stoker.launcher.watch.logs, stoker.launcher.why, stoker.launcher.control, "
        "stoker.launcher.watch.job_end"
    )
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert {"stoker.api", "stoker.launcher.launch.submit"} <= modules  # the parse saw them
    heavy = sorted(m for m in modules if m.split(".")[0] in TRAINING_STACK)
    assert not heavy, f"`import stoker; stoker.submit` imports {heavy[:10]}"


def test_stoker_run_counts_gpus_without_torch_where_there_is_no_gpu_driver(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.launcher import run_local

    code = (
        "import sys; from stoker.launcher import run_local as r; "
        "r._GPU_DRIVER_NODES = (r.Path(sys.argv[1]),); "
        "print(r.local_gpus(), r.default_nproc(), 'torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "no-such-device")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert result.stdout.split() == ["0", "2", "False"]  # 2 CPU ranks, torch never loaded
    # With a driver's device node, torch counts (CUDA_VISIBLE_DEVICES, ROCm included).
    import torch

    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(run_local, "_GPU_DRIVER_NODES", (node,))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert run_local.local_gpus() == 3 and run_local.default_nproc() == 3
