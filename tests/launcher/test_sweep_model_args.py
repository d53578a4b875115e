"""A sweep over a plugin model's `model.args` (examples/own_model, whose factory declares
`Args(width: int, ...)`): one array task per value, each task's frozen config carrying
its value; a value the declared arguments refuse stops the sweep before anything is
written or queued, naming the task, the key and the value. Every task's model is checked
in one child process, not one per task.

Without SLURM: a dry run, and a fake `sbatch`/`scontrol` on PATH for what a real
submission writes (the run folder, its frozen configs, the ledger). The command runs in
the test process (`stoker_text`); the model check's child process is real."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.clirun import stoker_text

REPO = Path(__file__).resolve().parents[2]

EXPERIMENT = """\
job:
  name: widths
model:
  arch: own_model.denoiser:build
  args:
    width: 8
data:
  batch_size: 2
  resolution: [32, 32]
"""

# sbatch: `--test-only` accepts, `--parsable` answers a job id; every call logged.
FAKE_SBATCH = """#!/bin/sh
echo "sbatch $*" >> "$(dirname "$0")/calls"
case "$1" in
--test-only) echo "sbatch: Job 4242 to start at now" >&2 ;;
--parsable) echo 4242 ;;
*) exit 1 ;;
esac
"""
FAKE_SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "$(dirname "$0")/calls"
echo "ClusterName = fake"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder (not a git repository: submitted as it is) holding the package
    own_model and exp.yaml naming its factory."""
    folder = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "own_model", folder)
    (folder / "exp.yaml").write_text(EXPERIMENT)
    return folder


@pytest.fixture
def fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """(env, calls): PATH with the fake SLURM commands first; the file they log to."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scontrol", FAKE_SCONTROL)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    return {"PATH": f"{tools}:{os.environ['PATH']}"}, tools / "calls"


def nothing_created(home: Path) -> None:
    runs = home / ".stoker" / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "a run folder was created"
    assert not (home / ".stoker" / "ledger.sqlite").exists(), "a ledger entry was written"
    store = home / ".stoker" / "mlflow" / "mlflow.db"  # made already (tests/conftest.py)
    assert not store.exists() or _runs_in(store) == 0, "an MLflow run was created"


def _runs_in(store: Path) -> int:
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)) as db:
        return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])


def test_a_dry_run_lists_one_task_per_value(project: Path, isolated_home: Path) -> None:
    result = stoker_text("sweep", "exp.yaml", "model.args.width=16,32", "--dry-run", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=0-1\n" in result.stdout
    assert "task 0: model.args.width=16\ntask 1: model.args.width=32" in result.stderr
    nothing_created(isolated_home)


def test_each_tasks_frozen_config_carries_its_value(
    project: Path, isolated_home: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, calls = fake_slurm
    result = stoker_text(
        "sweep", "exp.yaml", "model.args.width=16,32", "--json", cwd=project, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "4242_0  model.args.width=16" in result.stdout
    run_dir = Path(json.loads(result.stdout.strip().splitlines()[-1])["run_dir"])
    frozen = [
        yaml.safe_load((run_dir / "tasks" / str(i) / "config.yaml").read_text()) for i in (0, 1)
    ]
    assert [cfg["model"]["args"] for cfg in frozen] == [{"width": 16}, {"width": 32}]
    assert all(cfg["model"]["arch"] == "own_model.denoiser:build" for cfg in frozen)
    assert "sbatch --parsable" in calls.read_text()


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_a_value_the_factory_refuses_stops_the_sweep_before_anything_is_written(
    project: Path, isolated_home: Path, fake_slurm: tuple[dict[str, str], Path], dry_run: bool
) -> None:
    env, calls = fake_slurm
    flags = ["--dry-run"] if dry_run else []
    result = stoker_text(
        "sweep", "exp.yaml", "model.args.width=16,abc", *flags, cwd=project, env=env
    )
    assert result.returncode == 2, result.stderr
    assert "sweep task 1 (model.args.width=abc): model.args.width: got 'abc'" in result.stderr
    assert "(model.args.width from override model.args.width=abc)" in result.stderr
    assert "fix: Args takes width, depth, noise" in result.stderr
    nothing_created(isolated_home)
    assert not calls.exists(), calls.read_text()  # SLURM was not asked


def test_the_tasks_models_are_checked_in_one_child_process(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four tasks, two distinct models (the learning rate does not change the model):
    one child process, given the two configs."""
    from stoker.config import resolve_config
    from stoker.launcher.launch.submit import SubmitOptions
    from stoker.launcher.launch.sweep import check_task_models, plan_sweep

    children: list[list[str]] = []
    real_run = subprocess.run

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        children.append(argv)
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    plan = plan_sweep(["model.args.width=16,32", "optim.lr=1e-4,3e-4"])
    configs = [resolve_config(project / "exp.yaml", plan.overrides(i)) for i in range(4)]
    check_task_models(plan, configs, SubmitOptions(cwd=project))
    assert len(children) == 1
    assert children[0].count("--config") == 2
