"""How long one `stoker status` refresh takes for 200 real jobs, against submitit's watcher.

    eval "$(python tests/cluster/localslurm.py env)"   # or any cluster sbatch talks to
    python benchmarks/status.py [--jobs 200] [--finished 60] [--refreshes 10] [--out DIR]

Submits `--jobs` individual jobs to the running cluster (`--finished` of them
`--wrap true`, which end at once; the rest `--hold`, which stay pending), records
them in a ledger under a temporary STOKER_HOME, and times, for the same ids:

    stoker cold        collect_status() on a ledger that has cached nothing yet; it
                       writes each ended job's final state back (one sqlite commit each)
    stoker warm        the same after a first refresh cached the ended jobs
    stoker CLI cold    `stoker status --all --json` end to end (a new process)
    stoker CLI warm    the same on the warmed ledger
    submitit cold      SlurmInfoWatcher.update() for all ids, then each job's state
    submitit warm      the same watcher again (it caches finished jobs too)

and counts scheduler calls per refresh (in-process from slurm_cli.CALLS; for the
CLI through logging wrappers of squeue and sacct on PATH, in one untimed run).
The target is 0.5 s per refresh. All jobs are cancelled at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.targets import select_jobs
from stoker.launcher.slurm import cli as slurm_cli
from stoker.launcher.watch.status import collect_status

TARGET_S = 0.5
STOKER = str(Path(sys.executable).with_name("stoker"))
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def sbatch(*options: str) -> str:
    result = subprocess.run(
        ["sbatch", "--parsable", "--time=1", "--output=/dev/null", *options],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"sbatch failed: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


def wait_accounted(job_ids: list[str], timeout: float = 300) -> None:
    """Until sacct shows every one of `job_ids` ended (slurmdbd lags slurmctld a little)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sacct", "-j", ",".join(job_ids), "-X", "-n", "-P", "-o", "JobID,State"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        states = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if all(states.get(j, "").split(" ")[0] in ENDED for j in job_ids):
            return
        time.sleep(1)
    raise SystemExit(f"the {len(job_ids)} short jobs did not all end within {timeout:.0f} s")


def make_ledger(path: Path, job_ids: list[str], runs: Path, submitted_at: float) -> None:
    ledger = Ledger(path)
    for i, job_id in enumerate(job_ids):
        run_dir = runs / f"job{i}"
        run_dir.mkdir(parents=True, exist_ok=True)
        # A real job writes these; reading them is part of the refresh's cost.
        (run_dir / "attempts").write_text(f"{submitted_at:.0f} restart=0 nodes=n1\n")
        (run_dir / "progress.json").write_text(
            json.dumps({"step": i, "total_steps": 1000, "loss": 1.0, "samples_per_s": 100.0})
        )
        ledger.add(
            JobRecord(
                job_id=job_id,
                backend="slurm",
                cluster="bench",
                name=f"bench{i}",
                run_dir=str(run_dir),
                config_digest="0",
                template="default",
                submitted_at=submitted_at,
            )
        )


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def logging_path(folder: Path, log: Path) -> str:
    """A PATH whose squeue and sacct append their name to `log`, then run the real one."""
    folder.mkdir()
    for command in ("squeue", "sacct"):
        real = shutil.which(command)
        assert real, command
        wrapper = folder / command
        wrapper.write_text(f'#!/bin/sh\necho {command} >> "{log}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--finished", type=int, default=60, help="how many of them end at once")
    parser.add_argument("--refreshes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        print('needs a SLURM cluster: eval "$(python tests/cluster/localslurm.py env)"')
        return 2
    from submitit.slurm.slurm import SlurmInfoWatcher

    work = Path(tempfile.mkdtemp(prefix="stoker-bench-status-"))
    os.environ["STOKER_HOME"] = str(work / "home")
    job_ids: list[str] = []
    try:
        submitted_at = time.time()
        print(f"submitting {args.jobs} jobs ({args.finished} short, the rest held) ...")
        for i in range(args.jobs):
            held = i >= args.finished
            job_ids.append(
                sbatch(f"--job-name=bench{i}", *(["--hold"] if held else []), "--wrap=true")
            )
        wait_accounted(job_ids[: args.finished])

        pristine = work / "pristine.sqlite"
        make_ledger(pristine, job_ids, work / "runs", submitted_at)
        home_ledger = Path(os.environ["STOKER_HOME"]) / "ledger.sqlite"
        home_ledger.parent.mkdir(parents=True)

        def fresh_ledger(path: Path) -> Ledger:
            shutil.copy(pristine, path)
            return Ledger(path)

        def stoker_refresh(ledger: Ledger) -> int:
            rows = collect_status(select_jobs(ledger, all_jobs=True), ledger).rows
            return sum(row.state != "UNKNOWN" for row in rows)

        # Copies made before timing: a cold refresh is timed without the file copy.
        cold_ledgers = [fresh_ledger(work / f"cold{i}.sqlite") for i in range(args.refreshes)]

        def stoker_cold() -> None:
            stoker_refresh(cold_ledgers.pop())

        warm_ledger = fresh_ledger(work / "warm.sqlite")
        stoker_refresh(warm_ledger)  # caches the ended jobs

        def cli(cold: bool) -> None:
            if cold:
                shutil.copy(pristine, home_ledger)
            subprocess.run(
                [STOKER, "status", "--all", "--json"], stdout=subprocess.DEVNULL, check=True
            )

        def submitit_refresh(watcher: Any) -> int:
            watcher.update()
            states = [watcher.get_state(j, mode="cache") for j in job_ids]
            return sum(state != "UNKNOWN" for state in states)

        def submitit_cold() -> None:
            watcher = SlurmInfoWatcher(delay_s=600)
            for job_id in job_ids:
                watcher.register_job(job_id)
            submitit_refresh(watcher)

        warm_watcher = SlurmInfoWatcher(delay_s=600)
        for job_id in job_ids:
            warm_watcher.register_job(job_id)
        submitit_refresh(warm_watcher)

        # Calls and jobs with a known state, per refresh of each kind.
        slurm_cli.CALLS.clear()
        known_stoker_cold = stoker_refresh(fresh_ledger(work / "count.sqlite"))
        calls_cold = dict(slurm_cli.CALLS)
        slurm_cli.CALLS.clear()
        known_stoker_warm = stoker_refresh(warm_ledger)
        calls_warm = dict(slurm_cli.CALLS)
        shutil.copy(pristine, home_ledger)
        log = work / "calls.log"
        subprocess.run(
            [STOKER, "status", "--all", "--json"],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PATH": logging_path(work / "shim", log)},
            check=True,
        )
        logged = log.read_text().split()
        calls_cli = {c: logged.count(c) for c in sorted(set(logged))}
        cold_watcher = SlurmInfoWatcher(delay_s=600)
        for job_id in job_ids:
            cold_watcher.register_job(job_id)
        known_submitit_cold = submitit_refresh(cold_watcher)
        known_submitit_warm = submitit_refresh(cold_watcher)
        submitit_calls = {"sacct": 1}

        cases: dict[str, tuple[Callable[[], Any], dict[str, int], int]] = {
            "stoker cold": (stoker_cold, calls_cold, known_stoker_cold),
            "stoker warm": (lambda: stoker_refresh(warm_ledger), calls_warm, known_stoker_warm),
            "stoker CLI cold": (lambda: cli(True), calls_cli, known_stoker_cold),
            "stoker CLI warm": (lambda: cli(False), calls_warm, known_stoker_warm),
            "submitit cold": (submitit_cold, submitit_calls, known_submitit_cold),
            "submitit warm": (
                lambda: submitit_refresh(warm_watcher),
                submitit_calls,
                known_submitit_warm,
            ),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.refreshes):  # interleaved: load on the machine hits all alike
            for name, (fn, _, _) in cases.items():
                samples[name].extend(timed(fn, 1))
    finally:
        if job_ids:
            subprocess.run(["scancel", *job_ids], check=False)
        shutil.rmtree(work, ignore_errors=True)

    medians = {name: statistics.median(values) for name, values in samples.items()}
    baseline = {"cold": medians["submitit cold"], "warm": medians["submitit warm"]}
    rows = []
    print(f"{'case':<18} {'median s':>9} {'p90 s':>7} {'x submitit':>11} {'known':>6}  calls")
    for name, values in samples.items():
        _, calls, known = cases[name]
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        ratio = medians[name] / baseline["cold" if "cold" in name else "warm"]
        rows.append(
            {
                "case": name,
                "median_s": round(medians[name], 4),
                "p90_s": round(p90, 4),
                "ratio_to_submitit": round(ratio, 2),
                "calls_per_refresh": calls,
                "jobs_with_known_state": known,
            }
        )
        print(f"{name:<18} {medians[name]:>9.3f} {p90:>7.3f} {ratio:>11.2f} {known:>6}  {calls}")
    worst = max(medians[n] for n in samples if n.startswith("stoker"))
    verdict = "meets" if worst <= TARGET_S else "MISSES"
    print(f"slowest stoker refresh: {worst:.3f} s, {verdict} the {TARGET_S} s target")

    version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, check=False)
    now = dt.datetime.now(dt.timezone.utc)
    result = {
        "benchmark": "status",
        "date": now.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "slurm": version.stdout.strip(),
        "jobs": args.jobs,
        "finished_jobs": args.finished,
        "held_jobs": args.jobs - args.finished,
        "refreshes": args.refreshes,
        "baseline": "submitit SlurmInfoWatcher (one sacct for all ids, finished jobs cached)",
        "target_s": TARGET_S,
        "meets_target": worst <= TARGET_S,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"status-{result['machine']['host']}-{now:%Y-%m-%d}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
