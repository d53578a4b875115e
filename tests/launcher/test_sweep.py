"""`stoker sweep`: one SLURM job array, one frozen config and one MLflow child run per task."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.errors import StokerError
from stoker.launcher.launch.sweep import plan_sweep
from tests.clirun import stoker_text
from tests.launcher_jobs import scontrol_job, wait_final

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"

PRINT_TASK = (
    "import os, yaml; c = yaml.safe_load(open(os.environ['STOKER_CONFIG'])); "
    "print(os.environ['STOKER_JOB_ID'], c['optim']['lr'], c['train']['seed'], "
    "os.environ['MLFLOW_RUN_ID'], os.environ['STOKER_PARENT_RUN_ID'])"
)


def test_plan_is_the_grid_in_order_and_keeps_fixed_overrides() -> None:
    plan = plan_sweep(
        ["optim.lr=1e-4,3e-4,1e-3", "train.seed=1,2", "train.steps=5", "data.resolution=[32,32]"]
    )
    assert plan.fixed == ["train.steps=5", "data.resolution=[32,32]"]
    assert len(plan.tasks) == 6
    assert plan.tasks[0] == {"optim.lr": "1e-4", "train.seed": "1"}
    assert plan.tasks[1] == {"optim.lr": "1e-4", "train.seed": "2"}
    assert plan.overrides(5)[-2:] == ["optim.lr=1e-3", "train.seed=2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["optim.lr=1e-4"], "no sweep axis"),
        (["optim.lr=1e-4,,3e-4"], "empty value"),
        (["lr"], "is not KEY=V1,V2"),
        (["a=1,2", "a=3,4"], "given twice"),
    ],
)
def test_bad_sweep_arguments_are_named(args: list[str], message: str) -> None:
    with pytest.raises(StokerError, match=message):
        plan_sweep(args)


@pytest.mark.slurm
def test_six_task_sweep_is_one_array_with_six_child_runs(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    import json

    from mlflow.tracking import MlflowClient

    # As docs/jobs.md writes it, with a command that prints each task's settings in the
    # trainer's place (six trainer tasks would be minutes of CPU).
    result = stoker_text(
        "sweep",
        str(TINY),
        "optim.lr=1e-4,3e-4,1e-3",
        "train.seed=1,2",
        "--max-parallel",
        "2",
        "--time",
        "5",
        "--json",
        "--",
        sys.executable,
        "-c",
        PRINT_TASK,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout.strip().splitlines()[-1])
    job_id, run_dir = job["job_id"], Path(job["run_dir"])
    assert scontrol_job(f"{job_id}_0").get("ArrayJobId") == job_id
    assert "--array=0-5%2" in (run_dir / "job.sbatch").read_text()
    seen = {}
    for index in range(6):
        assert wait_final(f"{job_id}_{index}") == "COMPLETED"
        line = (run_dir / "tasks" / str(index) / "logs" / "r0" / "rank-0.log").read_text().split()
        seen[index] = line
        assert line[0] == f"{job_id}_{index}"
        assert line[4] == job["run_id"]
    assert {(float(s[1]), int(s[2])) for s in seen.values()} == {
        (lr, seed) for lr in (1e-4, 3e-4, 1e-3) for seed in (1, 2)
    }
    client = MlflowClient(f"sqlite:///{os.environ['STOKER_HOME']}/mlflow/mlflow.db")
    parent = client.get_run(job["run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{job['run_id']}'",
    )
    assert len(children) == 6
    by_id = {c.info.run_id: c for c in children}
    assert set(by_id) == set(job["child_run_ids"])
    for index, line in seen.items():
        child = by_id[line[3]]  # the run id the task was given
        assert child.data.tags["stoker.sweep.index"] == str(index)
        assert float(child.data.params["optim.lr"]) == float(line[1])
        assert child.data.tags["slurm.job_id"] == f"{job_id}_{index}"


def test_sweep_takes_the_job_flags_of_submit(tmp_path: Path) -> None:
    result = stoker_text(
        "sweep",
        "optim.lr=1e-4,3e-4",
        "--ntasks-per-node",
        "2",
        "--mem",
        "1G",
        "--after",
        "41",
        "--max-parallel",
        "1",
        "--explain",
        "--",
        "true",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --ntasks-per-node=2  # flag --ntasks-per-node" in result.stdout
    assert "#SBATCH --mem=1G  # flag --mem" in result.stdout
    assert "#SBATCH --dependency=afterok:41  # flag --after" in result.stdout
    assert "#SBATCH --array=0-1%1" in result.stdout


def test_a_long_first_axis_is_an_override_not_a_file_name() -> None:
    from stoker.cli.config import split_experiment_args

    axis = "train.seed=" + ",".join(str(i) for i in range(1, 101))  # 300 bytes: ENAMETOOLONG
    assert split_experiment_args([axis, "train.steps=5"]) == (None, [axis, "train.steps=5"])
    assert len(plan_sweep([axis]).tasks) == 100


def test_a_list_valued_key_is_swept_on_its_top_level_commas(tmp_path: Path) -> None:
    """`optim.betas=[0.9,0.95],[0.9,0.99]`: two tasks, each config resolved with its whole
    list; a list alone (`[32,32]`) is one value, not an axis."""
    (tmp_path / "examples").symlink_to(Path(__file__).resolve().parents[2] / "examples")
    result = stoker_text(
        "sweep",
        "examples/tiny.yaml",
        "optim.betas=[0.9,0.95],[0.9,0.99]",
        "--dry-run",
        "--no-check",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=0-1" in result.stdout
    assert plan_sweep(["optim.betas=[0.9,0.95],[0.9,0.99]", "data.resolution=[32,32]"]).tasks == [
        {"optim.betas": "[0.9,0.95]"},
        {"optim.betas": "[0.9,0.99]"},
    ]
    # A quote opens a value only where YAML's would: an apostrophe inside a word does not
    # swallow the commas after it.
    assert plan_sweep(["job.env.WHO=o'brien,smith"]).tasks == [
        {"job.env.WHO": "o'brien"},
        {"job.env.WHO": "smith"},
    ]
