"""The training runtime on the real 2-node SLURM cluster: `stoker submit
examples/tiny.yaml --nodes 2 --ntasks-per-node 2` trains with HSDP (FSDP2
inside a node, replicas across the two) over gloo, and its losses repeat a
1-rank run with the same global batch: same samples, same per-sample noise,
only the order of floating-point sums differs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.clirun import stoker
from tests.launcher_jobs import submit_json, wait_final

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny.yaml")
# No loader workers (what is compared is the arithmetic across rank counts): a worker's
# fork server preloads torch, seconds of CPU per rank on the 2-core VM.
SHORT = ["train.steps=30", "train.log_every=5", "checkpoint.every=0", "data.num_workers=0"]


def _losses(client: object, run_id: str) -> dict[int, float]:
    history = client.get_metric_history(run_id, "loss")  # type: ignore[attr-defined]
    return {m.step: m.value for m in history}


def test_four_ranks_on_two_nodes_train_like_one(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    job = submit_json(TINY, *SHORT, "--nodes", "2", "--ntasks-per-node", "2", "--time", "10",
                      cwd=tmp_path, in_process=True)  # fmt: skip
    run_dir = Path(job["run_dir"])
    # The 1-rank reference, here, while the job waits on SLURM and starts. The synthetic
    # data set both use is written once: the first to take its lock writes it, the other
    # waits for it (stoker/data/synthetic/default_set.py). One torch thread, as each SLURM rank has
    # (--cpus-per-task=1): two would spin against the job's ranks for the 2 cores.
    local = stoker("run", TINY, *SHORT, "--nproc", "1", "--json", cwd=tmp_path, timeout=600,
                   env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    one = json.loads(local.stdout.strip().splitlines()[-1])
    state = wait_final(job["job_id"], 600)
    logs = "\n".join(p.read_text() for p in sorted((run_dir / "logs").rglob("*.log")))
    assert state == "COMPLETED", logs[-4000:]
    assert "finished at step 30" in (run_dir / "logs" / "r0" / "rank-0.log").read_text()
    assert (run_dir / "checkpoints" / "step-30" / ".metadata").is_file()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{os.environ['STOKER_HOME']}/mlflow/mlflow.db")
    run = client.get_run(job["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.arch"] == "av_dit" and run.data.params["job.nodes"] == "2"
    assert run.data.tags["stoker.world_size"] == "4" and run.data.tags["stoker.nodes"] == "2"
    artifacts = {a.path for a in client.list_artifacts(job["run_id"])}
    assert {"job.sbatch", "config.yaml"} <= artifacts
    # system/<node>/... from each node's sampler (system/time/..., system/throughput/...
    # system/goodput/... and the like are the trainer's).
    trainer_groups = {"throughput", "time", "checkpoint", "stragglers", "data", "memory", "goodput"}
    system = {k.split("/")[1] for k in run.data.metrics if k.startswith("system/")}
    system -= trainer_groups
    assert len(system) == 2, f"system metrics from each node, got {sorted(system)}"

    four, single = _losses(client, job["run_id"]), _losses(client, one["run_id"])
    assert sorted(four) == sorted(single) == list(range(5, 31, 5))
    for step in four:
        assert abs(four[step] - single[step]) <= 1e-3 * abs(single[step]), (step, four, single)
