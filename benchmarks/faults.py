"""How fast stoker notices each fault and is training again, on the local SLURM
cluster with the real runtime (tests/faults/ proves the outcomes; this times them).

    python benchmarks/faults.py [--scenarios preempt,time-limit,killed-task,frozen-node,hang]
        [--timeout-s 20] [--out DIR]

About 6 minutes on a 2-core VM. Starts the local cluster if it is not running
(tests/cluster/localslurm.py; leaves it running). Each scenario is one 2-node
job (one CPU rank per node, examples/tiny.yaml made smaller, a checkpoint every 5
steps, a loss logged every step), run one after the other, and cancelled once it
trains again after the fault (tests/faults/ proves such jobs run to the end):

  preempt      `scontrol requeue` once a checkpoint is committed (as preemption:
               SIGTERM, save, SLURM requeues)
  time-limit   a 2-minute limit with USR2 60 s before it (save, exit 75, requeue)
  killed-task  SIGKILL of rank 1 (srun ends rank 0; restart without that node)
  frozen-node  SIGSTOP of rank 1's whole node (rank 0's collective times out after
               train.collective_timeout_s; SLURM marks the node down and requeues)
  hang         rank 1's data stalls (the watchdog, train.hang_timeout_s; stacks;
               job.max_restarts=0, so no recovery is timed)

Times, from the fault (the requeue call, the USR2 event, the kill, the freeze, the
stall's last progress):
  detect    until every rank of the hit start has stopped (its last log write) or,
            for the hang, the watchdog's report
  recover   until the first loss MLflow holds from the next start (training again)
  redone    steps trained again: from the checkpoint resumed to the last step
            logged before the fault
The baseline is the bound each detection works against, in the same run's config
(train.collective_timeout_s, train.hang_timeout_s, the stop grace), and torch's
own default for a lost peer (gloo's 30 minutes): detect / bound is printed.

Writes DIR/faults-<host>-<date>.json (default benchmarks/results) with the machine,
SLURM's version, every time and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import machine_info  # noqa: E402
from tests.cluster import localslurm  # noqa: E402
from tests.faults.training_jobs import (  # noqa: E402
    FAST,
    TINY,
    TWO_NODES,
    committed_steps,
    kill_task,
    mlflow_client,
    rank_pid,
    resumed_step,
    starts,
)

STOKER = str(Path(sys.executable).with_name("stoker"))
GLOO_DEFAULT_S = 1800.0
SCENARIOS = ("preempt", "time-limit", "killed-task", "frozen-node", "hang")


def submit(*args: str, cwd: Path) -> dict[str, str]:
    result = subprocess.run([STOKER, "submit", "--json", *args], cwd=cwd, capture_output=True,
                            text=True, check=False)  # fmt: skip
    if result.returncode:
        raise SystemExit(f"submit failed:\n{result.stderr}")
    job: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return job


def job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                         text=True, check=False).stdout  # fmt: skip
    fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
    return fields.get("JobState", "")


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_final(job_id: str, timeout: float) -> str:
    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
    wait(lambda: job_state(job_id) in final, timeout, f"job {job_id} to end")
    return job_state(job_id)


def training(tmp: Path, timeout_s: float, *extra: str) -> tuple[dict[str, str], Path]:
    # Steps enough that no start ends the run before its fault (the time limit's USR2
    # comes 30-90 s into a start); each job is cancelled once it trains again.
    job = submit(TINY, *FAST, "train.steps=2000", "train.log_every=1", "checkpoint.every=5",
                 "checkpoint.keep_last=100", f"train.collective_timeout_s={timeout_s:g}",
                 *TWO_NODES, *extra, cwd=tmp)  # fmt: skip
    run_dir = Path(job["run_dir"])
    wait(lambda: max(committed_steps(run_dir), default=0) >= 10, 300, "step-10 committed")
    return job, run_dir


def recovery(job: dict[str, str], run_dir: Path, fault_at: float, hit: int) -> dict[str, Any]:
    """Detect / recover / redone for a fault at `fault_at` that hit start `hit`: once the
    next start has logged a loss, the job is cancelled (tests/faults proves it completes)."""
    client = mlflow_client()
    log = run_dir / "logs" / f"r{hit + 1}" / "rank-0.log"

    def resumed_training() -> bool:
        return log.exists() and "resumed from" in log.read_text() and "step " in log.read_text()

    wait(resumed_training, 600, "the next start to train")
    stopped = (run_dir / "logs" / f"r{hit}" / "rank-0.log").stat().st_mtime

    def logged_again() -> bool:
        history = client.get_metric_history(job["run_id"], "loss")
        return any(m.timestamp / 1000 > stopped for m in history)

    wait(logged_again, 60, "its first loss")
    subprocess.run(["scancel", job["job_id"]], check=False)
    history = client.get_metric_history(job["run_id"], "loss")
    before = max(m.step for m in history if m.timestamp / 1000 <= fault_at)
    resumed = resumed_step(run_dir, hit + 1) or 0
    first_new = min(m.timestamp / 1000 for m in history if m.timestamp / 1000 > stopped)
    return {"detect_s": stopped - fault_at, "recover_s": first_new - fault_at,
            "redone_steps": max(0, before - resumed), "resumed_from": resumed,
            "outcome": f"resumed from step {resumed}"}  # fmt: skip


def preempt(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s, "--time", "10")
    fault_at = time.time()
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True)
    return {**recovery(job, run_dir, fault_at, 0), "bound": "KillWait 5 s"}


def time_limit(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s, "--time", "2", "job.stop_grace=60",
                            "job.max_requeues=5")  # fmt: skip
    events = run_dir / "events"
    wait(lambda: events.exists() and "SIGUSR2" in events.read_text(), 300, "the USR2")
    line = next(x for x in events.read_text().splitlines() if "SIGUSR2" in x)
    fault_at = float(line.split()[0])
    return {**recovery(job, run_dir, fault_at, 0), "bound": "job.stop_grace 60 s"}


def killed_task(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s, "--time", "10")
    pid, node = rank_pid(run_dir, 0, 1)
    fault_at = time.time()
    kill_task(job["job_id"], node, pid)
    return {**recovery(job, run_dir, fault_at, 0), "bound": f"srun (collective {timeout_s:g} s)"}


def frozen_node(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s, "--time", "10")
    _, node = rank_pid(run_dir, 0, 1)
    fault_at = time.time()
    frozen = localslurm.freeze_node(node)
    try:
        wait(lambda: len(starts(run_dir)) == 2, 300, "the job to start again")
    finally:
        localslurm.thaw(frozen)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                       capture_output=True, check=False)  # fmt: skip
    result = recovery(job, run_dir, fault_at, 0)
    result["ratio_vs_torch_default"] = result["detect_s"] / GLOO_DEFAULT_S
    return {**result, "bound": f"train.collective_timeout_s {timeout_s:g} s",
            "bound_s": timeout_s}  # fmt: skip


def hang(tmp: Path, timeout_s: float) -> dict[str, Any]:
    from stoker.data.synthetic.shapes import synth_dataset

    data = tmp / "hang-data"
    synth_dataset(str(data), clips=8, seconds=2.0, size=(32, 32), fps=8)
    job = submit(TINY, *FAST, f"data.url={data}", "data.num_workers=0", "train.steps=1000",
                 f"train.hang_timeout_s={timeout_s:g}", "checkpoint.every=0",
                 "job.max_restarts=0", *TWO_NODES, "--time", "10", "--", sys.executable,
                 str(REPO / "tests" / "faults" / "hang_rank.py"), "1", "3", cwd=tmp)  # fmt: skip
    state = wait_final(job["job_id"], 300)
    report = json.loads((Path(job["run_dir"]) / "heartbeat" / "r0" / "hang.json").read_text())
    stalled_at = report["detected_at"] - report["stalled_s"]
    return {"detect_s": report["detected_at"] - stalled_at, "recover_s": None,
            "redone_steps": None, "outcome": f"{state}: rank {report['rank']} in phase "
            f"'{report['phase']}', stacks dumped (job.max_restarts=0)",
            "bound": f"train.hang_timeout_s {timeout_s:g} s", "bound_s": timeout_s}  # fmt: skip


RUNNERS = {"preempt": preempt, "time-limit": time_limit, "killed-task": killed_task,
           "frozen-node": frozen_node, "hang": hang}  # fmt: skip


def table(results: dict[str, dict[str, Any]]) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    lines = ["| scenario | outcome | detect | recover | redone steps | bound | detect/bound |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        ratio = f"{r['detect_s'] / r['bound_s']:.2f}" if r.get("bound_s") else "-"
        redone = "-" if r["redone_steps"] is None else str(r["redone_steps"])
        times = f"{seconds(r['detect_s'])} | {seconds(r['recover_s'])}"
        lines.append(f"| {name} | {r['outcome']} | {times} | {redone} | {r['bound']} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=20.0,
        help="train.collective_timeout_s and train.hang_timeout_s (default 20)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    names = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(names) - set(RUNNERS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")

    settings = localslurm.start(verbose=False)
    os.environ.update(settings.env)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="stoker-faults-") as tmp:
        os.environ["STOKER_HOME"] = str(Path(tmp) / "home")
        for name in names:
            started = time.monotonic()
            results[name] = RUNNERS[name](Path(tmp), args.timeout_s)
            results[name]["wall_s"] = time.monotonic() - started
            print(f"{name}: {results[name]}", flush=True)
    text = table(results)
    print(text)
    slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=False)
    machine = machine_info()
    record = {"benchmark": "faults", "date": date.today().isoformat(), "machine": machine,
              "slurm": slurm.stdout.strip(), "cluster": "local (tests/cluster/localslurm.py)",
              "timeout_s": args.timeout_s, "results": results, "table": text}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"faults-{machine['host']}-{date.today().isoformat()}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
