"""`stoker submit` against the real three-node cluster: launch, quoting, preflight, requeue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.launcher.jobs.ledger import Ledger
from tests.clirun import stoker_text
from tests.launcher_jobs import JOBS, rank_lines, submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
PYTHON = sys.executable
TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


def test_two_nodes_four_ranks_all_reduce(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    job = submit_json(
        "--nodes",
        "2",
        "--ntasks-per-node",
        "2",
        "--time",
        "5",
        "--",
        PYTHON,
        str(JOBS / "allreduce.py"),
        "--lr",  # the docs' `-- python my_train.py --lr 3e-4`
        "3e-4",
        cwd=tmp_path,
        in_process=True,
    )
    assert wait_final(job["job_id"]) == "COMPLETED", (
        Path(job["run_dir"]) / "logs" / "batch.log"
    ).read_text()
    ranks = rank_lines(Path(job["run_dir"]))
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, text in ranks.items():
        assert f"rank={rank} " in text and "world=4" in text and "sum=6 ok=True" in text, text
        assert "argv=['--lr', '3e-4']" in text, text  # reached the script as typed
    # Ranks 0-1 on the first node, 2-3 on the second; all meet at the first node's NodeAddr.
    nodes = {rank: text.split("node=")[1].split()[0] for rank, text in ranks.items()}
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert {text.split("master=")[1].split(":")[0] for text in ranks.values()} == {"127.0.0.1"}
    assert {int(text.split("local_rank=")[1].split()[0]) for text in ranks.values()} == {0, 1}
    record = Ledger().require(job["job_id"])
    assert record.run_dir == job["run_dir"] and record.mlflow_run_id == job["run_id"]
    status = json.loads(stoker_text("status", job["job_id"], "--json", check=True).stdout)
    assert status[0]["state"] == "COMPLETED" and status[0]["restarts"] == 0
    logs = stoker_text("logs", job["job_id"], check=True).stdout
    for rank in range(4):
        assert f"[{rank}] rank={rank} " in logs

    # The MLflow run was made at submit, in the default store, with what the job ran.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{os.environ['STOKER_HOME']}/mlflow/mlflow.db")
    run = client.get_run(job["run_id"])
    assert run.data.tags["slurm.job_id"] == job["job_id"]
    assert run.data.tags["slurm.nodes"] == "2"
    assert run.data.params["job.nodes"] == "2"
    artifacts = {a.path for a in client.list_artifacts(job["run_id"])}
    assert {"job.sbatch", "config.yaml"} <= artifacts
    script = Path(client.download_artifacts(job["run_id"], "job.sbatch", str(tmp_path)))
    assert script.read_text() == (Path(job["run_dir"]) / "job.sbatch").read_text()


def test_dry_run_script_passes_sbatch_test_only(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    # docs/jobs.md's first submit, on the local nodes' 4 GPUs (it asks for 8, an H100 node's).
    gpus = str(slurm_cluster.gpus_per_node)
    result = stoker_text("submit", str(TINY), "train.steps=2000", "--nodes", "2", "--gpus-per-node",
                         gpus, "--time", "04:00:00", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=")
    script = tmp_path / "job.sh"
    script.write_text(result.stdout)
    check = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert not (Path(os.environ["STOKER_HOME"]) / "runs").exists(), "a dry run created a run folder"
    explained = stoker_text(
        "submit", "--explain", "--nodes", "2", "--", "python", "x.py", cwd=tmp_path
    )
    script.write_text(explained.stdout)
    assert "#SBATCH --nodes=2  # flag --nodes" in explained.stdout
    check = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_refused_request_shows_slurm_reason_and_leaves_nothing(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    # One task, which the nodes' CPUs hold: SLURM itself refuses the 64 GPUs.
    result = stoker_text("submit", "--gpus-per-node", "64", "--ntasks-per-node", "1", "--",
                         "true", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "SLURM refused the job" in result.stderr and "Nothing was submitted" in result.stderr
    runs = Path(os.environ["STOKER_HOME"]) / "runs"
    assert not runs.exists() or not list(runs.iterdir())
    assert Ledger().list() == []


def test_more_nodes_than_the_partition_has_is_refused_naming_its_size(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    result = stoker_text("submit", "--nodes", "5", "--", "true", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    said = "job.nodes=5 (flag --nodes), but partition debug (the cluster's default) has 3 nodes"
    assert said in result.stderr
    assert "fix: --nodes 3 or fewer" in result.stderr and "sinfo -s" in result.stderr
    assert Ledger().list() == []
    # Said before the model check (up to a minute), which would refuse this model too.
    both = stoker_text("submit", str(TINY), "model.arch=no_such_pkg.models:build",
                       "--nodes", "5", cwd=tmp_path)  # fmt: skip
    assert both.returncode == 2 and said in both.stderr and "no_such_pkg" not in both.stderr
    # A node's tasks must fit its CPUs (2 here): a task a GPU is more than that.
    cpus = stoker_text("submit", "--gpus-per-node", "4", "--", "true", cwd=tmp_path)
    assert cpus.returncode == 2, cpus.stderr
    assert ("4 tasks a node (one per GPU: job.gpus_per_node, flag --gpus-per-node) x "
            "job.cpus_per_task=1 = 4 CPUs a node, but partition debug (the cluster's default)'s "
            "nodes have 2; nothing was submitted") in cpus.stderr  # fmt: skip
    assert "fix: at most 2 CPUs a node (--ntasks-per-node, job.cpus_per_task)" in cpus.stderr
    tasks = stoker_text("submit", "--ntasks-per-node", "3", "--", "true", cwd=tmp_path)
    assert "job.ntasks_per_node=3 (flag --ntasks-per-node) x job.cpus_per_task=1" in tasks.stderr
    assert Ledger().list() == []


# The task reads its experiment's data set as the training runtime's loader opens it.
OPEN_DATA = """
import os
from pathlib import Path
from stoker.config import load_frozen
from stoker.data.sets.dataset import open_dataset
url = load_frozen(Path(os.environ["STOKER_CONFIG"])).data.url
print("samples", open_dataset(url).manifest.samples, "at", url)
"""


def test_a_relative_data_url_is_the_folder_it_was_given_in(
    slurm_cluster: ClusterSettings, tmp_path: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    """From a git repository, `stoker submit data.url=../d/packed`: the tasks run from the
    code snapshot (<run>/code/), and read the data set the user named from where they
    typed it, not a folder beside the snapshot."""
    data = synthetic_av_set(clips=8, size=(32, 32), sample_rate=8000)
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "read_data.py").write_text(OPEN_DATA)
    relative = os.path.relpath(data, repo)
    assert relative.startswith("../")
    job = submit_json(
        f"data.url={relative}", "checkpoint.root=ckpt", "--time", "5",
        "--", PYTHON, "read_data.py", cwd=repo, in_process=True,
    )  # fmt: skip
    run_dir = Path(job["run_dir"])
    assert wait_final(job["job_id"]) == "COMPLETED", rank_lines(run_dir)
    assert f"samples 8 at {data}" in rank_lines(run_dir)[0]
    frozen = (run_dir / "config.yaml").read_text()
    assert f"url: {data}\n" in frozen and f"root: {repo / 'ckpt'}\n" in frozen


def test_a_missing_data_set_is_refused_before_it_is_queued(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """What `stoker check` reports, `stoker submit` refuses, rather than a job failing
    seconds into its run after its wait in the queue."""
    result = stoker_text("submit", str(TINY), "data.url=../d/packed", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    missing = tmp_path.parent / "d" / "packed"
    assert f"data.url '{missing}' (override data.url=../d/packed) does not exist" in result.stderr
    assert "nothing was submitted" in result.stderr and "stoker data pack SRC" in result.stderr
    assert Ledger().list() == []
    runs = Path(os.environ["STOKER_HOME"]) / "runs"
    assert not runs.exists() or not list(runs.iterdir())
    # A path only the compute nodes see (a node-local /scratch): --no-check lets it through.
    assert "a path only the compute nodes see: --no-check" in result.stderr
    trusted = stoker_text("submit", str(TINY), "data.url=../d/packed", "--no-check", "--json",
                          cwd=tmp_path)  # fmt: skip
    assert trusted.returncode == 0, trusted.stderr
    job_id = json.loads(trusted.stdout.strip().splitlines()[-1])["job_id"]
    assert stoker_text("cancel", job_id).returncode == 0  # it would fail: no data there


def test_a_plain_command_whose_script_is_missing_is_refused(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """`stoker submit --nodes 2 -- python train.py` in a folder without train.py."""
    result = stoker_text("submit", "--nodes", "2", "--", "python", "train.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"runs train.py, but {tmp_path / 'train.py'} does not exist" in result.stderr
    assert "nothing was submitted" in result.stderr
    assert "fix: run it from the folder that holds train.py" in result.stderr
    assert Ledger().list() == []


def test_no_command_runs_the_training_runtime(tmp_path: Path) -> None:
    result = stoker_text("submit", "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f'{sys.executable} -m stoker.runtime.train --config "$STOKER_CONFIG"' in result.stdout


def count_job(tmp_path: Path, steps: int, pause: float, *args: str) -> tuple[dict, Path]:
    state = tmp_path / "steps.txt"
    job = submit_json(
        *args,
        "--",
        PYTHON,
        str(JOBS / "count_steps.py"),
        str(state),
        str(steps),
        str(pause),
        cwd=tmp_path,
        in_process=True,
    )
    return job, state


def test_stoker_requeue_restarts_without_the_hold(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    job, state = count_job(tmp_path, 12, 0.5, "--time", "5")
    job_id = job["job_id"]
    wait_for(lambda: state.exists() and len(state.read_text().split()) >= 3, 60, "3 steps")
    result = stoker_text("requeue", job_id, check=True)
    assert result.stdout.strip() == f"requeued job {job_id}"
    assert wait_final(job_id, 120) == "COMPLETED"
    assert [int(s) for s in state.read_text().split()] == list(range(1, 13))
    assert "restart=1" in (Path(job["run_dir"]) / "attempts").read_text()


def test_evaluation_without_a_held_out_set_is_refused(tmp_path: Path) -> None:
    result = stoker_text(
        "submit", "--dry-run", "data.url=/data/av", "train.eval_every=100", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "train.eval_every=100 (override train.eval_every=100)" in result.stderr
    assert "data.eval_url" in result.stderr and "no held-out data set" in result.stderr


def test_bucket_batches_that_do_not_split_over_the_ranks_are_refused(tmp_path: Path) -> None:
    result = stoker_text(
        "submit", "--dry-run", "data.url=/data/av", "job.ntasks_per_node=2", "train.grad_accum=2",
        "data.buckets=[{clip_seconds: 1, batch_size: 8}, {clip_seconds: 2, batch_size: 6}]",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "data.buckets[1] (64x64x2s, override data.buckets=" in result.stderr
    assert "its batch_size 6 does not split over 2 ranks x train.grad_accum=2" in result.stderr
    assert "multiple of 4" in result.stderr
    # From a token budget: the fix names data.batch_multiple.
    budget = stoker_text(
        "submit", "--dry-run", "data.url=/data/av", "job.ntasks_per_node=4",
        "data.buckets=[{clip_seconds: 1}]", "data.batch_tokens=1000", cwd=tmp_path,
    )  # fmt: skip
    assert budget.returncode == 2, budget.stderr
    assert "data.batch_multiple=4" in budget.stderr


def test_a_mixture_with_a_held_out_set_needs_one(tmp_path: Path) -> None:
    result = stoker_text(
        "submit", "--dry-run", "data.sources=[{name: a, url: /data/a}, {name: b, url: /data/b}]",
        "train.eval_every=10", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "no held-out data set" in result.stderr, result.stderr
    fine = stoker_text(
        "submit", "--dry-run", "data.sources=[{name: a, url: /data/a}, {name: b, url: /data/b}]",
        "data.eval_url=/data/held-out", "train.eval_every=10", cwd=tmp_path,
    )  # fmt: skip
    assert fine.returncode == 0, fine.stderr


def test_a_job_is_named_after_its_experiment_file(tmp_path: Path) -> None:
    """An experiment that sets no job.name: the job, its run folder and MLflow run take
    the file's name (`sound-small.yaml` -> `sound-small`), or without a file the package
    of the user's model, not job.name's default; a job.name the file sets still wins."""
    exp = tmp_path / "sound-small.yaml"
    exp.write_text("train:\n  steps: 5\n")
    shown = stoker_text("submit", str(exp), "--explain", "--no-check", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "#SBATCH --job-name=sound-small  # default the experiment file's name" in shown.stdout
    assert "/runs/sound-small-" in shown.stdout
    exp.write_text("job:\n  name: mine\n")
    named = stoker_text("submit", str(exp), "--dry-run", "--no-check", cwd=tmp_path)
    assert "#SBATCH --job-name=mine\n" in named.stdout, named.stdout[:400]
    # No file, a model of one's own: named after its package.
    own = stoker_text(
        "submit", "model.arch=own_model.denoiser:build", "--dry-run", "--no-check", cwd=tmp_path
    )
    assert "#SBATCH --job-name=own_model\n" in own.stdout, own.stderr or own.stdout[:400]


def test_a_command_is_named_after_its_script_past_its_options_values() -> None:
    """`-- python -X dev train.py` is `train` in squeue, not `dev`; so with a launcher's
    own words and values before the script (`uv run`, `torchrun --rdzv-backend c10d`)."""
    from stoker.launcher.launch.job_name import name_from_command

    assert name_from_command(["python", "-X", "dev", "train.py"]) == "train"
    assert name_from_command(["uv", "run", "python", "fit.py"]) == "fit"
    assert name_from_command(["torchrun", "--rdzv-backend", "c10d", "tools/pre train.py"]) == (
        "pre-train"
    )
    assert name_from_command(["python", "-m", "pkg.fit", "--config", "a.py"]) == "fit"
    assert name_from_command(["bash", "-c", "python x.py"]) == "bash"
    assert name_from_command(["sleep", "60"]) == "sleep"


def test_a_container_job_is_checked_through_its_mounts(
    tmp_path: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    """A job in a container reads `data.url: /data/av` through `job.mounts: [HOST:/data]`:
    submit checks the host's side of the mount, and leaves a path of the image's own (no
    mount holds it) to the job, which alone can see it."""
    from stoker.config import resolve_config
    from stoker.errors import StokerError
    from stoker.launcher.launch.local_inputs import check_local_inputs

    data = synthetic_av_set(clips=8, size=(32, 32), sample_rate=8000)
    container = ["job.container=docker://pytorch", f"job.mounts=['{data.parent}:/data']"]
    mounted = [*container, f"data.url=/data/{data.name}", "checkpoint.root=/ckpt/run1"]
    check_local_inputs(resolve_config(None, mounted, use_profile=False), ["true"], tmp_path)
    missing = resolve_config(None, [*container, "data.url=/data/nope"], use_profile=False)
    with pytest.raises(StokerError) as refused:
        check_local_inputs(missing, ["true"], tmp_path)
    said, host = str(refused.value), data.parent / "nope"
    assert f"data.url '/data/nope' (override data.url=/data/nope) (at {host} on" in said
    assert "does not exist" in said and f"`stoker data synth {host}`" in str(refused.value.fix)
