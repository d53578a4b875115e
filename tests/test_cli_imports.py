"""Login-node speed: `stoker --help` and every command's `--help` import none of the
heavy modules, and a group's `--help` none of its commands' modules. Checked in a fresh
interpreter with `-X importtime`, which lists every module the process imported."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import pytest
import typer

from stoker.cli.app import app
from stoker.cli.command_table import COMMANDS

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
    # stoker/cli/output.py's tables and colours: a command imports it when it prints.
    "rich",
}


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    # typer vendors click: a group is whatever lists sub-commands (building each here).
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            paths += command_paths(command.get_command(ctx, name), (*prefix, name))
    return paths


ALL_COMMANDS = command_paths(typer.main.get_command(app))
# The commands' own modules (stoker/cli/command_table.py): a group's help lists them from
# the table; building the 28 commands and importing their modules was ~40 of the 110 ms
# `stoker --help` took on a 2-core VM (issue 37).
COMMAND_MODULES = {
    where.split(":")[0] for table in COMMANDS.values() for where, _ in table.values()
}
LAZY_GROUPS = {(), *((name,) for name in COMMANDS if name != "stoker")}


def imported_modules(*args: str) -> set[str]:
    return run_with_importtime(*args)[0]


def run_with_importtime(*args: str) -> tuple[set[str], str]:
    """`python -X importtime -m stoker ARGS`: the modules it imported beyond what a bare
    interpreter imports here (`interpreter_imports`), and its stdout."""
    modules, stdout = _importtime("-m", "stoker", *args)
    return modules - interpreter_imports(), stdout


@functools.cache
def interpreter_imports() -> frozenset[str]:
    """What `python -c pass` imports in this environment: its site's, and under
    scripts/coverage-suite coverage's own (json among them), which start before stoker."""
    return frozenset(_importtime("-c", "pass")[0])


def _importtime(*args: str) -> tuple[set[str], str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
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
    return modules, result.stdout


def test_every_command_is_checked() -> None:
    assert ("init",) in ALL_COMMANDS and ("config", "show") in ALL_COMMANDS
    assert len(ALL_COMMANDS) >= 5


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "stoker")
def test_help_imports_no_heavy_module(path: tuple[str, ...]) -> None:
    """The help rendered (the first time: typer and the command's module), then printed
    again from stoker/cli/help_cache.py's cache: the same text, without typer."""
    modules, rendered = run_with_importtime(*path, "--help")
    command = " ".join(("stoker", *path, "--help"))
    cached_modules, cached = run_with_importtime(*path, "--help")
    assert cached == rendered and rendered.startswith(f"Usage: {command[:-7]}")
    assert "typer" in modules and "stoker.cli.help_cache" in cached_modules
    third_party = sorted(m for m in cached_modules if m.split(".")[0] in {"typer", *HEAVY})
    assert not third_party, f"`{command}` printed from the cache imports {third_party[:10]}"
    assert "stoker.cli.main" in modules  # the parse saw the real import list
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`{command}` imports {heavy[:10]}"
    if path in LAZY_GROUPS:  # the group's own module, none of its commands'
        own = {COMMANDS["stoker"][path[0]][0].split(":")[0]} if path else set()
        commands = sorted((modules & COMMAND_MODULES) - own)
        assert not commands, f"`{command}` imports {commands}"


def test_the_guard_catches_a_heavy_import() -> None:
    # `config show` does import pydantic and yaml: the same parse must see them.
    modules = imported_modules("config", "show", "--json")
    assert {"pydantic", "yaml"} <= {m.split(".")[0] for m in modules}
    assert "stoker.cli.config" in modules & COMMAND_MODULES


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
