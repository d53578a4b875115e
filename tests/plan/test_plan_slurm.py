"""`stoker plan --partition P`: the target's nodes and GPUs read from SLURM (sinfo) on
the local cluster. Apart from tests/plan/test_plan_cli.py so that those tests, which need
no cluster, run beside the cluster tests (`make test` runs a module with a test on the
cluster in the cluster tests' process, one test at a time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from tests.clirun import stoker_text
from tests.plan.test_plan_cli import TINY

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings


@pytest.mark.slurm
def test_a_partitions_gpus_come_from_sinfo(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    """The local cluster's partition: 3 nodes with GRES gpu:4 (no type: --gpu says it)."""
    partition = slurm_cluster.partition
    no_type = stoker_text("plan", TINY, "--partition", partition)
    assert no_type.returncode != 0
    assert f"partition {partition} (sinfo)" in no_type.stderr and "--gpu" in no_type.stderr
    planned = tmp_path / "planned.yaml"  # the docs' `--partition gpu --write planned.yaml`
    result = stoker_text("plan", TINY, "data.batch_size=8", "job.spare_nodes=1", "--partition",
                         partition, "--gpu", "H100", "--nodes", "2", "--write", str(planned),
                         "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(planned.read_text())["job"]
    assert (written["gpus_per_node"], written["nodes"]) == (slurm_cluster.gpus_per_node, 2)
    # The docs' next step, `stoker submit planned.yaml`, as the script it would queue: 4
    # ranks a node are more than these 2-CPU nodes take, and a run on GPUs needs GPUs (the
    # local CPUs' plan runs in test_plan_cli.py).
    script = stoker_text("submit", str(planned), "--dry-run", cwd=tmp_path)
    assert script.returncode == 0, script.stderr
    # 2 nodes and the spare; a rank per GPU, though tiny.yaml asks for 2 CPU ranks a node.
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n" in (
        script.stdout)  # fmt: skip
    plan = json.loads(result.stdout)
    target = plan["target"]
    assert (target["ranks_per_node"], target["world"], target["spare_nodes"]) == (4, 8, 1)
    assert target["source"].startswith(f"partition {partition} (sinfo)")
    assert target["source"].endswith("+ 1 spare node(s)"), target["source"]
    assert plan["settings"]["job.spare_nodes"] == 1
    # The spare must fit the partition beside the training nodes.
    no_room = stoker_text("plan", TINY, "job.spare_nodes=1", "--partition", partition, "--gpu",
                          "H100", "--nodes", "3")  # fmt: skip
    assert no_room.returncode != 0
    assert (
        "3 nodes asked (--nodes or job.nodes) and 1 spare (job.spare_nodes) but partition "
        f"{partition} (sinfo) has 3"
    ) in no_room.stderr and "at most 2 nodes" in no_room.stderr
    too_many = stoker_text("plan", TINY, "--partition", partition, "--gpu", "H100", "--nodes", "9")
    assert too_many.returncode != 0
    assert f"9 nodes asked (--nodes or job.nodes) but partition {partition} (sinfo) has 3" in (
        too_many.stderr)  # fmt: skip
    # Two nodes: FSDP over all 8 ranks and HSDP (2 nodes x 4) are both candidates.
    assert {c["layout"] for c in plan["candidates"]} == {"fsdp", "hsdp"}
    assert plan["settings"]["train.sharding"] in ("all", "node")
