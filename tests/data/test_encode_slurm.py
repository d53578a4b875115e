"""`stoker data encode --slurm` on the local cluster: an array through stoker's launcher
(in the ledger, returns at once), one task killed while it encodes, and a re-run that
encodes only the missing shard into the same bytes as a local encode in one process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.data.synthetic.shapes import synth_dataset
from tests.clirun import stoker_text
from tests.data.sample_encoders import SLOW_KEYS
from tests.launcher_jobs import run_story, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

REPO = Path(__file__).resolve().parents[2]
ENCODER = "tests.data.sample_encoders:slow"


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parts[len(root.parts)] in ("shards", "manifest.json")
    }


@pytest.mark.slurm
def test_an_encode_array_killed_in_one_task_is_finished_by_a_rerun(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    synth_dataset(str(src), clips=8, seconds=1.0, size=(64, 64), samples_per_shard=2)
    encode = ("data", "encode", str(src))
    local = tmp_path / "local"
    stoker_text(*encode, str(local), "-e", ENCODER, "--workers", "1", cwd=REPO, check=True)

    dst = tmp_path / "slurm"
    # As docs/data.md writes it: a GPU a task (the nodes' fake GRES; torch finds no CUDA,
    # the encoder runs on the CPU), `--time 4:00:00 -p gpu`.
    slurm = ("-e", ENCODER, "--slurm", "--gpus-per-node", "1", "--time", "4:00:00",
             "-p", slurm_cluster.partition)  # fmt: skip
    # Shard 2 (clips 4 and 5) takes ten minutes in this first job only: it is killed then.
    submitted = stoker_text(*encode, str(dst), *slurm, "--json", cwd=REPO,
                            env={SLOW_KEYS: "clip-000004=600"})  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout.strip().splitlines()[-1])
    job_id, run_dir = job["job_id"], Path(job["run_dir"])
    rows = json.loads(stoker_text("status", job_id, "--json", check=True).stdout)
    assert [r["job_id"] for r in rows] == [f"{job_id}_{i}" for i in range(4)]
    assert {r["name"] for r in rows} == {"stoker-encode"}

    for task in (0, 1, 3):
        state = wait_final(f"{job_id}_{task}", timeout=600, run_dir=run_dir / "tasks" / str(task))
        assert state == "COMPLETED", run_story(run_dir / "tasks" / str(task))
    log = run_dir / "tasks" / "2" / "logs" / "r0" / "rank-0.log"
    wait_for(lambda: log.exists() and "sleeping 600 s" in log.read_text(), timeout=300,
             what=f"task 2 to start encoding shard 2 ({log})")  # fmt: skip
    subprocess.run(["scancel", f"{job_id}_2"], check=True)
    assert wait_final(f"{job_id}_2", timeout=300) == "CANCELLED"
    assert not (dst / "manifest.json").exists()
    assert sorted(p.name for p in (dst / "shards").glob("*.tar")) == [
        "shard-000000.tar", "shard-000001.tar", "shard-000003.tar"
    ]  # fmt: skip
    why = stoker_text("why", f"{job_id}_2", check=True).stdout
    assert "CANCELLED" in why, why
    kept = {p: os.stat(p).st_mtime_ns for p in (dst / "shards").iterdir()}

    # The same command again: one task, for shard 2 alone; it waits and completes the set.
    again = stoker_text(*encode, str(dst), *slurm, "--wait", "--json", cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["samples"] == 8
    works = sorted((dst / "encode-work").glob("*.json"), key=os.path.getmtime)
    assert json.loads(works[-1].read_text())["groups"] == [[2]]
    assert {p: os.stat(p).st_mtime_ns for p in kept} == kept  # nothing rewritten
    assert tree(dst) == tree(local)  # byte-identical to one local process
