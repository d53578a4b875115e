"""How fast stoker notices each fault and is training again, on the local SLURM
cluster with the real runtime (tests/faults/ proves the outcomes; this times them),
restarts inside the allocation against the requeue path in the same run.

    python benchmarks/faults.py [--scenarios killed-task,killed-task-requeue,...]
        [--timeout-s 20] [--out DIR]

About 12 minutes on a 2-core VM. Starts the local cluster if it is not running
(tests/cluster/localslurm.py; leaves it running). Each scenario is one job of two
training nodes (one CPU rank per node, examples/tiny.yaml made smaller, a checkpoint
every 5 steps, a loss logged every step), run one after the other and cancelled once
it trains again after the fault (tests/faults/ proves such jobs run to the end):

  killed-task           SIGKILL of rank 1, job.spare_nodes=1: in place on the spare
  killed-task-requeue   the same without a spare: requeued without the node
  stopped-rank          SIGSTOP of rank 1 alone (its node healthy), no spare: a lost
                        rank, in place on the same nodes once SLURM killed it
  frozen-node           SIGSTOP of rank 1's whole node, job.spare_nodes=1: the step
                        given up at once, in place on the spare
  frozen-node-requeue   the same without a spare: given up after KillWait and a
                        margin, requeued without the node
  hang                  rank 1's data stalls in the first attempt, job.spare_nodes=1:
                        the watchdog (train.hang_timeout_s), in place on the spare
  preempt               `scontrol requeue` (as preemption: SIGTERM, save, requeue)
  time-limit            a 2-minute limit with USR2 60 s before it (save, requeue)

The parts of a recovery, from the fault (the kill, the freeze, the stall's last
progress, the requeue call, the USR2 event), each up to the next point:
  detect      the batch script's decision (its `restarting ...`/`requeued ...` event;
              for a requeue from outside, the stop it got), in whole seconds (so
              detect and start share up to 1 s)
  start       rank 0's process of the next attempt began (srun, and for a requeue the
              queue and SLURM's credential hold)
  imports     its session began (Python and torch imported)
  rendezvous  every rank joined
  tracking    its MLflow run open
  load        the model built and the checkpoint loaded (the start line)
  first_step  the first loss of the next attempt in MLflow
recover is their sum: the fault to training again. The requeue paths wait for the test
cluster's credential hold (cred_expire=10 s); `recover_default_cred_s` adds what
SLURM's default (120 s) would add. The ratio printed for a fault with both paths is
in place / requeue recover.

Writes DIR/faults-<host>-<date>.json (default benchmarks/results) with the machine,
SLURM's version, every time, the parts and the table.
"""

from __future__ import annotations

import argparse
import itertools
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
DEFAULT_CRED_EXPIRE_S = 120.0
SPARE = "job.spare_nodes=1"
PARTS = ("detect", "start", "imports", "rendezvous", "tracking", "load", "first_step")
SCENARIOS = ("killed-task", "killed-task-requeue", "stopped-rank", "frozen-node",
             "frozen-node-requeue", "hang", "preempt", "time-limit")  # fmt: skip
PAIRS = {"killed-task": "killed-task-requeue", "frozen-node": "frozen-node-requeue"}


def submit(*args: str, cwd: Path) -> dict[str, str]:
    result = subprocess.run([STOKER, "submit", "--json", *args], cwd=cwd, capture_output=True,
                            text=True, check=False)  # fmt: skip
    if result.returncode:
        raise SystemExit(f"submit failed:\n{result.stderr}")
    job: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return job


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def training(tmp: Path, timeout_s: float, *extra: str) -> tuple[dict[str, str], Path]:
    # Steps enough that no start ends the run before its fault (the time limit's USR2
    # comes 30-90 s into a start); each job is cancelled once it trains again.
    job = submit(TINY, *FAST, "train.steps=2000", "train.log_every=1", "checkpoint.every=5",
                 "checkpoint.keep_last=100", f"train.collective_timeout_s={timeout_s:g}",
                 "job.max_restarts=2", *TWO_NODES, "--time", "10", *extra, cwd=tmp)  # fmt: skip
    run_dir = Path(job["run_dir"])
    wait(lambda: max(committed_steps(run_dir), default=0) >= 10, 300, "step-10 committed")
    return job, run_dir


def _event_at(run_dir: Path, prefixes: tuple[str, ...], after: float) -> float | None:
    path = run_dir / "events"
    for line in path.read_text().splitlines() if path.exists() else []:
        stamp, _, text = line.partition(" ")
        if text.startswith(prefixes) and float(stamp) >= int(after):
            return float(stamp)
    return None


def _start_line(run_dir: Path, attempt: int) -> dict[str, Any] | None:
    path = run_dir / "accounting" / f"r{attempt}.jsonl"
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = json.loads(raw)
        if line.get("kind") == "start":
            return dict(line)
    return None


def recovery(job: dict[str, str], run_dir: Path, fault_at: float, hit: int) -> dict[str, Any]:
    """The parts of the recovery from a fault at `fault_at` that hit attempt `hit`; once
    the next attempt has logged a loss the job is cancelled (tests/faults proves it
    completes)."""
    client = mlflow_client()
    nxt = hit + 1
    wait(lambda: _start_line(run_dir, nxt) is not None, 600, "the next attempt to train")
    start = _start_line(run_dir, nxt) or {}
    loaded = float(start["at"])

    def logged_again() -> bool:
        history = client.get_metric_history(job["run_id"], "loss")
        return any(m.timestamp / 1000 > loaded for m in history)

    wait(logged_again, 120, "its first loss")
    subprocess.run(["scancel", job["job_id"]], check=False)
    history = client.get_metric_history(job["run_id"], "loss")
    first_loss = min(m.timestamp / 1000 for m in history if m.timestamp / 1000 > loaded)
    # The script's decision; for a requeue from outside (preemption), the stop it got.
    decided = _event_at(run_dir, ("restarting ", "requeued after "), fault_at)
    if decided is None:
        decided = _event_at(run_dir, ("stop requested",), fault_at)
    attempt = next(fields for at, k, fields in _attempt_lines(run_dir) if k == nxt)
    marks = start.get("marks", {})
    points = [fault_at, decided, marks.get("process"), marks.get("session"),
              marks.get("joined"), marks.get("tracking"), loaded, first_loss]  # fmt: skip
    parts = {}
    for name, (a, b) in zip(PARTS, itertools.pairwise(points), strict=True):
        parts[name] = None if a is None or b is None else round(b - a, 2)
    before = [m.step for m in history if m.timestamp / 1000 <= fault_at]
    resumed = resumed_step(run_dir, nxt) or 0
    how = attempt.get("how", "?")
    recover = first_loss - fault_at
    result = {"how": how, "parts_s": parts, "recover_s": round(recover, 2),
              "redone_steps": max(0, max(before, default=0) - resumed), "resumed_from": resumed,
              "outcome": f"{how}, resumed from step {resumed}"}  # fmt: skip
    if how == "requeue":
        extra = DEFAULT_CRED_EXPIRE_S - localslurm.CRED_EXPIRE_S
        result["recover_default_cred_s"] = round(recover + extra, 2)
    return result


def _attempt_lines(run_dir: Path) -> list[tuple[float, int, dict[str, str]]]:
    out = []
    for line in (run_dir / "attempts").read_text().splitlines():
        fields = dict(item.split("=", 1) for item in line.split()[1:] if "=" in item)
        out.append((float(line.split()[0]), int(fields["restart"]), fields))
    return out


def killed(spare: bool) -> Callable[[Path, float], dict[str, Any]]:
    def run(tmp: Path, timeout_s: float) -> dict[str, Any]:
        job, run_dir = training(tmp, timeout_s, *([SPARE] if spare else []))
        pid, node = rank_pid(run_dir, 0, 1)
        fault_at = time.time()
        kill_task(job["job_id"], node, pid)
        return recovery(job, run_dir, fault_at, 0)

    return run


def stopped_rank(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s)
    pid, node = rank_pid(run_dir, 0, 1)
    fault_at = time.time()
    kill_task(job["job_id"], node, pid, signal="STOP")
    return {**recovery(job, run_dir, fault_at, 0), "bound": f"collective {timeout_s:g} s"}


def frozen(spare: bool) -> Callable[[Path, float], dict[str, Any]]:
    def run(tmp: Path, timeout_s: float) -> dict[str, Any]:
        job, run_dir = training(tmp, timeout_s, *([SPARE] if spare else []))
        _, node = rank_pid(run_dir, 0, 1)
        fault_at = time.time()
        pids = localslurm.freeze_node(node)
        try:
            wait(lambda: len(starts(run_dir)) == 2, 300, "the job to start again")
            result = recovery(job, run_dir, fault_at, 0)
        finally:
            localslurm.thaw(pids)
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                           capture_output=True, check=False)  # fmt: skip
        return {**result, "bound": f"collective {timeout_s:g} s"}

    return run


def hang(tmp: Path, timeout_s: float) -> dict[str, Any]:
    from stoker.data.synthetic.shapes import synth_dataset

    data = tmp / "hang-data"
    synth_dataset(str(data), clips=8, seconds=2.0, size=(32, 32), fps=8)
    job = submit(TINY, *FAST, f"data.url={data}", "train.steps=1000", "train.log_every=1",
                 f"train.hang_timeout_s={timeout_s:g}", "checkpoint.every=5",
                 "job.max_restarts=1", SPARE, *TWO_NODES, "--time", "10", "--",
                 sys.executable, str(REPO / "tests" / "faults" / "hang_rank.py"), "1", "12",
                 "0", cwd=tmp)  # fmt: skip
    run_dir = Path(job["run_dir"])
    report_path = run_dir / "heartbeat" / "r0" / "hang.json"
    wait(report_path.exists, 300, "the watchdog's report")
    report = json.loads(report_path.read_text())
    stalled_at = report["detected_at"] - report["stalled_s"]
    return {**recovery(job, run_dir, stalled_at, 0), "bound": f"hang {timeout_s:g} s"}


def preempt(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s)
    fault_at = time.time()
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True)
    return {**recovery(job, run_dir, fault_at, 0), "bound": "KillWait 5 s"}


def time_limit(tmp: Path, timeout_s: float) -> dict[str, Any]:
    job, run_dir = training(tmp, timeout_s, "--time", "2", "job.stop_grace=60",
                            "job.max_requeues=5")  # fmt: skip
    events = run_dir / "events"
    wait(lambda: events.exists() and "SIGUSR2" in events.read_text(), 300, "the USR2")
    line = next(x for x in events.read_text().splitlines() if "SIGUSR2" in x)
    return {**recovery(job, run_dir, float(line.split()[0]), 0), "bound": "stop_grace 60 s"}


RUNNERS: dict[str, Callable[[Path, float], dict[str, Any]]] = {
    "killed-task": killed(spare=True), "killed-task-requeue": killed(spare=False),
    "stopped-rank": stopped_rank, "frozen-node": frozen(spare=True),
    "frozen-node-requeue": frozen(spare=False), "hang": hang, "preempt": preempt,
    "time-limit": time_limit,
}  # fmt: skip


def table(results: dict[str, dict[str, Any]]) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    head = " | ".join(PARTS)
    lines = [f"| scenario | how | {head} | recover s | with cred 120 s | redone |",
             "|---|---|" + "---|" * len(PARTS) + "---|---|---|"]  # fmt: skip
    for name, r in results.items():
        parts = " | ".join(cell(r["parts_s"][p]) for p in PARTS)
        default = cell(r.get("recover_default_cred_s"))
        lines.append(f"| {name} | {r['how']} | {parts} | {cell(r['recover_s'])} | {default} | "
                     f"{r['redone_steps']} |")  # fmt: skip
    return "\n".join(lines)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """In place / requeue recover, for each fault measured both ways."""
    return {f"{a} / {b}": results[a]["recover_s"] / results[b]["recover_s"]
            for a, b in PAIRS.items() if a in results and b in results}  # fmt: skip


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
            results[name]["wall_s"] = round(time.monotonic() - started, 1)
            print(f"{name}: {results[name]}", flush=True)
    text = table(results)
    print(text)
    found = ratios(results)
    for pair, ratio in found.items():
        print(f"recover, {pair}: {ratio:.2f}")
    slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=False)
    machine = machine_info()
    record = {"benchmark": "faults", "date": date.today().isoformat(), "machine": machine,
              "slurm": slurm.stdout.strip(), "cluster": "local (tests/cluster/localslurm.py)",
              "cred_expire_s": localslurm.CRED_EXPIRE_S, "timeout_s": args.timeout_s,
              "results": results, "ratios": found, "table": text}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"faults-{machine['host']}-{date.today().isoformat()}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
