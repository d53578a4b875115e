"""How long `stoker insights` takes over a ledger of 10,000 ended jobs.

    python benchmarks/insights.py [--jobs 10000] [--repeats 5] [--slurm 0] [--out DIR]

Builds a ledger under a temporary STOKER_HOME: `--jobs` ended jobs, each with the
account a stoker command keeps once it sees a job end (users, partitions,
experiments, causes, nodes and MFU drawn from a seeded generator), and times:

    insights               collect() + the report: what `stoker insights --json` computes
    insights CLI           `stoker insights --since all --all-users --json` end to end
    html, prometheus       rendering the report as the HTML page and the text format
    ledger read (floor)    Ledger.list() of the same rows: the least any report costs
    recompute (baseline)   making each account again from its run folder, as a report
                           that kept nothing would (timed on --recompute jobs, scaled)

With `--slurm K` (a cluster sbatch talks to: `eval "$(python tests/cluster/localslurm.py
env)"`), K short real jobs are submitted and left unsettled in the ledger: the first
`insights` asks squeue and sacct about them in batches of SACCT_BATCH ids and makes
their accounts (`first call`); the calls are counted. The target: 2 s for 10,000 jobs.
Exit status 1 when it is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info
from benchmarks.status import timed
from stoker.job_time import CAUSES
from stoker.launcher.insights.report import SACCT_BATCH, collect
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.slurm import cli as slurm_cli
from stoker.launcher.watch.job_account import ACCOUNTS_KEY, BLAME_KINDS, JobAccount, NodeBlame

TARGET_S = 2.0
STOKER = str(Path(sys.executable).with_name("stoker"))
CAUSES_SEEN = ("hung", "time-limit", "gpu-oom", "node-failure", "nccl-timeout", "exception")


def fake_account(rng: random.Random, job_id: str, ended_at: float) -> JobAccount:
    allocated = rng.uniform(1, 512)
    productive = allocated * rng.uniform(0.5, 0.97)
    weights = [rng.random() for _ in CAUSES]
    lost = {
        c: (allocated - productive) * w / sum(weights) for c, w in zip(CAUSES, weights, strict=True)
    }
    failed = rng.random() < 0.15
    nodes = [NodeBlame(f"gpu{rng.randrange(64):03d}", rng.choice(BLAME_KINDS), 0)
             for _ in range(rng.choice((0, 0, 0, 1, 2)))]  # fmt: skip
    return JobAccount(
        job_id=job_id, name=f"exp{rng.randrange(40)}", experiment=f"team{rng.randrange(6)}",
        user=f"user{rng.randrange(30)}", partition=rng.choice(("h100", "h200", "debug")),
        state="FAILED" if failed else "COMPLETED",
        cause=rng.choice(CAUSES_SEEN) if failed else None,
        submitted_at=ended_at - allocated * 60, ended_at=ended_at, resource="GPU",
        per_rank=1.0, allocated_h=allocated, productive_h=productive, lost_h=lost,
        queue_after_requeue_h=rng.uniform(0, 0.5), starts=rng.choice((1, 1, 1, 2, 3)),
        mfu=rng.uniform(0.2, 0.55), samples_per_s=rng.uniform(5, 50), nodes=nodes,
    )  # fmt: skip


def fill_ledger(ledger: Ledger, jobs: int, runs: Path, now: float) -> None:
    """`jobs` ended jobs with kept accounts, written in one transaction (a fake
    ledger's set-up is not what is timed)."""
    import sqlite3

    rng = random.Random(0)
    records = []
    for i in range(jobs):
        job_id = str(100_000 + i)
        ended = now - rng.uniform(0, 6 * 86400)
        account = fake_account(rng, job_id, ended)
        run_dir = runs / f"job{i}"
        records.append(JobRecord(
            job_id=job_id, backend="slurm", cluster="bench", name=account.name,
            run_dir=str(run_dir), config_digest="0", template="default",
            submitted_at=account.submitted_at, final_state=account.state,
            extra={"user": account.user, ACCOUNTS_KEY: {job_id: account.to_json()},
                   "reasons": {job_id: "..."} if account.cause else {}},
        ))  # fmt: skip
    ledger.add(records[0])  # the schema
    with sqlite3.connect(ledger.path) as db:
        columns = "job_id, backend, cluster, name, run_dir, config_hash, template, " \
                  "submitted_at, mlflow_run_id, tracking_uri, array_size, restarts, " \
                  "final_state, extra"  # fmt: skip
        db.executemany(f"INSERT OR REPLACE INTO jobs ({columns}) VALUES ({', '.join('?' * 14)})",
                       [r._row() for r in records])  # fmt: skip


def write_run_folders(runs: Path, count: int, now: float) -> None:
    """A real-looking run folder (attempts, a time account of 20 windows, a config) for
    the first `count` jobs: what recomputing an account reads."""
    for i in range(count):
        run = runs / f"job{i}"
        (run / "accounting").mkdir(parents=True)
        (run / "config.yaml").write_text("job:\n  gpus_per_node: 8\n  partition: h100\n")
        began = now - 3600
        (run / "attempts").write_text(f"{began:.0f} restart=0 job={i} nodes=gpu001\n")
        lines = [{"kind": "start", "at": began + 20, "restart": 0, "start_step": 0, "ranks": 8},
                 {"kind": "first_step", "at": began + 30}]  # fmt: skip
        lines += [{"kind": "window", "at": began + 30 + 100 * k, "step": 100 * k, "steps": 100,
                   "step_s": 100.0, "data_s": 2.0, "checkpoint_s": 1.0, "sample_s": 0.0,
                   "mfu": 0.4, "samples_per_s": 20.0} for k in range(1, 21)]  # fmt: skip
        lines.append({"kind": "end", "at": began + 2040, "step": 2000, "status": "FINISHED",
                      "checkpoint_s": 3.0, "sample_s": 0.0})  # fmt: skip
        (run / "accounting" / "r0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def submit_short_jobs(count: int) -> list[str]:
    ids = []
    for _ in range(count):
        argv = ["sbatch", "--parsable", "--time=1", "--output=/dev/null", "--wrap", "true"]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"sbatch failed: {result.stderr.strip()}")
        ids.append(result.stdout.strip().split(";")[0])
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recompute", type=int, default=200, help="jobs to time recomputing")
    parser.add_argument("--slurm", type=int, default=0, help="short real jobs left unsettled")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="stoker-insights-bench-"))
    os.environ["STOKER_HOME"] = str(home)
    now = time.time()
    ledger = Ledger(home / "ledger.sqlite")
    runs = home / "runs"
    fill_ledger(ledger, args.jobs, runs, now)
    write_run_folders(runs, args.recompute, now)
    results: dict[str, Any] = {}

    first: dict[str, Any] = {}
    if args.slurm:
        ids = submit_short_jobs(args.slurm)
        for i, job_id in enumerate(ids):
            ledger.add(JobRecord(job_id=job_id, backend="slurm", cluster="bench",
                                 name=f"real{i}", run_dir=str(runs / f"real{i}"),
                                 config_digest="0", template="default",
                                 submitted_at=now))  # fmt: skip
        time.sleep(5)  # let most of them end: their accounts are made on the first call
        calls_before = dict(slurm_cli.CALLS)
        started = time.perf_counter()
        report, _ = collect(ledger, all_users=True)
        first = {
            "seconds": time.perf_counter() - started,
            "unsettled_jobs": args.slurm,
            "scheduler_calls": {k: v - calls_before.get(k, 0) for k, v in slurm_cli.CALLS.items()},
            "batch": SACCT_BATCH,
        }
        subprocess.run(["scancel", *ids], capture_output=True, check=False)

    def insights() -> None:
        collect(ledger, all_users=True)

    report, _ = collect(ledger, all_users=True)
    total = len(report.accounts)
    results["insights"] = timed(insights, args.repeats)
    results["ledger read (floor)"] = timed(ledger.list, args.repeats)
    env = {**os.environ, "STOKER_HOME": str(home)}
    results["insights CLI"] = timed(lambda: subprocess.run(
        [STOKER, "insights", "--since", "all", "--all-users", "--json"], env=env,
        stdout=subprocess.DEVNULL, check=True), max(1, args.repeats // 2))  # fmt: skip

    from stoker.launcher.insights.html import render as html
    from stoker.launcher.insights.prometheus import render as prometheus
    from stoker.launcher.jobs.targets import Target
    from stoker.launcher.watch.job_account import make_account

    results["html"] = timed(lambda: html(report), args.repeats)
    results["prometheus"] = timed(lambda: prometheus(report), args.repeats)
    sample = [r for r in ledger.list() if Path(r.run_dir).name in
              {f"job{i}" for i in range(args.recompute)}]  # fmt: skip

    def recompute() -> None:
        for record in sample:
            make_account(Target(record), "COMPLETED", [], None)

    per_job = statistics.median(timed(recompute, 3)) / max(len(sample), 1)
    results["recompute (baseline)"] = [per_job * args.jobs]

    median = {name: statistics.median(s) for name, s in results.items()}
    floor, base = median["ledger read (floor)"], median["recompute (baseline)"]
    print(f"{total} jobs in the report; target {TARGET_S} s")
    for name, value in median.items():
        print(
            f"  {name:<22} {value:8.3f} s   x{value / floor:6.1f} the ledger read"
            f"   {base / value:8.1f}x faster than recomputing"
        )
    if first:
        print(
            f"  first call with {first['unsettled_jobs']} unsettled jobs: "
            f"{first['seconds']:.3f} s, scheduler calls {first['scheduler_calls']}"
        )
    ok = median["insights"] <= TARGET_S
    print("target met" if ok else f"target missed: {median['insights']:.3f} s > {TARGET_S} s")

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.date.today().isoformat()
    document = {
        "benchmark": "insights",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "jobs": args.jobs,
        "target_s": TARGET_S,
        "median_s": median,
        "samples_s": results,
        "ratios": {"insights_over_ledger_read": median["insights"] / floor,
                   "recompute_over_insights": base / median["insights"]},
        "first_call": first or None,
        "target_met": ok,
    }  # fmt: skip
    path = args.out / f"insights-{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    shutil.rmtree(home, ignore_errors=True)
    print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
