"""Helpers for the fault tests that run the real training runtime on the local
SLURM cluster: a small, fast variant of examples/tiny.yaml, and what to read
back from a run folder and from MLflow."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny.yaml")
# tiny.yaml at a quarter of the pixels and half the clip: ~0.2 s a step on a CPU rank.
# No loader workers: each rank's start would also start a fork server that preloads torch
# (seconds of CPU on the 2-core VM, per rank and per start); a test of the workers under a
# stop signal adds data.num_workers=1 (a later override wins).
FAST = ["data.batch_size=4", "data.resolution=[32,32]", "data.clip_seconds=0.5",
        "data.num_workers=0"]  # fmt: skip
# One task on each of two nodes, so a node can be lost while the other runs on.
TWO_NODES = ["--nodes", "2", "--ntasks-per-node", "1"]


_SYNTHETIC_SETS: dict[str, Path] = {}


def link_synthetic_data(factory: Any, *overrides: str) -> None:
    """Puts into this test's STOKER_HOME the synthetic data set that `data.url: null` reads
    (stoker/data/synthetic/default_set.py) for tiny.yaml with these overrides, made once per session
    (`factory`: pytest's tmp_path_factory) and linked. Otherwise the first start of each
    test's job writes the same 256 clips in a rank (~4 CPU-s, ~6 s on the loaded VM)
    while the other ranks wait for it; the tests here are about faults, not that."""
    from stoker.config import resolve_config
    from stoker.data.synthetic.default_set import ensure_synthetic_data, synthetic_data_path

    data = resolve_config(Path(TINY), overrides, use_profile=False).config.data
    name = synthetic_data_path(data).name
    if name not in _SYNTHETIC_SETS:
        test_home = os.environ["STOKER_HOME"]
        os.environ["STOKER_HOME"] = str(factory.mktemp("synthetic-home"))
        try:
            _SYNTHETIC_SETS[name] = ensure_synthetic_data(data)
        finally:
            os.environ["STOKER_HOME"] = test_home
    link = synthetic_data_path(data)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(_SYNTHETIC_SETS[name], target_is_directory=True)


def committed_steps(run_dir: Path) -> dict[int, float]:
    """step -> the time its COMMIT.json was written."""
    found = {}
    for commit in (run_dir / "checkpoints").glob("step-*/COMMIT.json"):
        found[int(commit.parent.name.split("-")[1])] = commit.stat().st_mtime
    return found


def starts(run_dir: Path) -> list[tuple[float, int, str]]:
    """(time, restart, node list) of every start, from the batch script's `attempts`."""
    path = run_dir / "attempts"
    lines = path.read_text().splitlines() if path.exists() else []
    out = []
    for line in lines:
        fields = dict(item.split("=", 1) for item in line.split()[1:])
        out.append((float(line.split()[0]), int(fields["restart"]), fields["nodes"]))
    return out


@dataclass(frozen=True)
class Event:
    at: float  # epoch seconds, as the batch script wrote them
    text: str


def events_of(run_dir: Path) -> list[Event]:
    """The batch script's events file, one Event per line."""
    path = run_dir / "events"
    lines = path.read_text().splitlines() if path.exists() else []
    return [Event(float(stamp), text) for stamp, _, text in (ln.partition(" ") for ln in lines)]


def event(run_dir: Path, regex: str) -> Event:
    """The one event that matches `regex`: read by what it says, not by its position
    (a loaded machine may add or reorder notes). Fails naming all events otherwise."""
    found = [e for e in events_of(run_dir) if re.search(regex, e.text)]
    assert len(found) == 1, f"{len(found)} events match {regex!r}: {events_of(run_dir)}"
    return found[0]


def hostnames(node_list: str) -> set[str]:
    result = subprocess.run(["scontrol", "show", "hostnames", node_list],
                            capture_output=True, text=True, check=True)  # fmt: skip
    return set(result.stdout.split())


def resumed_step(run_dir: Path, restart: int) -> int | None:
    """The checkpoint step rank 0 of that start resumed from; None if it started fresh."""
    text = (run_dir / "logs" / f"r{restart}" / "rank-0.log").read_text()
    found = re.search(r"^resumed from \S+/step-(\d+)$", text, re.M)
    return int(found.group(1)) if found else None


def rank_pid(run_dir: Path, restart: int, rank: int) -> tuple[int, str]:
    """(pid, node) of a rank, from its heartbeat."""
    beat = json.loads((run_dir / "heartbeat" / f"r{restart}" / f"rank-{rank}.json").read_text())
    return beat["pid"], beat["host"]


def job_processes(run_dir: Path) -> list[int]:
    """The pids of this machine's processes of the job in `run_dir` (its tasks and their
    children, whose environment names the run folder; not the batch script, which may
    still be ending the job's MLflow run): the nodes of the local cluster are processes
    here, so this is every node."""
    wanted = f"STOKER_RUN_DIR={run_dir}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = environ.read_bytes().split(b"\0")
            cmdline = (environ.parent / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if wanted in variables and b"slurm_script" not in cmdline:
            found.append(int(environ.parent.name))
    return found


def mlflow_client() -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{os.environ['STOKER_HOME']}/mlflow/mlflow.db")


def loss_history(run_id: str) -> list[tuple[int, float]]:
    """Every (step, loss) MLflow holds for the run, duplicates included, by step."""
    history = mlflow_client().get_metric_history(run_id, "loss")
    return sorted((m.step, m.value) for m in history)


def kill_task(job_id: str, node: str, pid: int, signal: str = "KILL", check: bool = True) -> None:
    """Signal one task of a running job on its node, as an operator would (or the
    kernel's OOM killer): a step of its own that overlaps the job's allocation.
    STOP stands for a process that hangs whole while its node stays healthy.
    `check=False`: a task that has ended already is no error."""
    argv = ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", f"-w{node}"]
    result = subprocess.run([*argv, "kill", f"-{signal}", str(pid)], capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert not check or result.returncode == 0, (
        f"kill -{signal} {pid} on {node} (job {job_id}): exit {result.returncode}\n"
        f"{result.stderr}")  # fmt: skip


def synth_experiment(tmp_path: Path, job: dict[str, Any], train: dict[str, Any]) -> Path:
    """An experiment file over 8 synthetic clips in tmp_path (no loader workers, no
    checkpoints), for tests whose ranks run the runtime under a test wrapper."""
    import yaml

    from stoker.data.synthetic.shapes import synth_dataset

    data = tmp_path / "data"
    synth_dataset(str(data), clips=8, seconds=2.0, size=(64, 64), fps=8)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "job": job,
        "data": {"url": str(data), "batch_size": 4, "num_workers": 0},
        "train": train,
        "checkpoint": {"every": 0},
    }))  # fmt: skip
    return exp


def run_logs(run_dir: Path) -> str:
    """The tail of every log of a run folder, for a failing assertion's message."""
    return "\n".join(
        f"== {p.relative_to(run_dir)}\n{p.read_text()[-2000:]}"
        for p in sorted((run_dir / "logs").rglob("*.log"))
    )
