"""`stoker run` logging into a real `mlflow server` that becomes unreachable mid-run and
comes back (tests/tcp_proxy.py in front of it refuses connections and resets those
open, as a stopped server does, and forwards again on the same port): training goes on
while the store is down, the run completes, and MLflow ends with every logged step
exactly once.

The built-in tiny experiment with 2 CPU ranks and `train.log_every=1`, so that every
step is a point of each trainer metric. RunLogger retries a store that does not answer
with a backoff of up to 30 s, so it may replay the spool while the run trains or only
in `close()` (which waits up to 30 s); either way the replay must be whole. The store
comes back at once (the proxy), so the run needs only the steps before, during and a
few after the outage (STEPS): with the real server restarted it needed 150 to train
through the ~17 s of the server's start."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.clirun import STOKER
from tests.mlflow_server import RestartableServer
from tests.tcp_proxy import TcpProxy

# At ~9 steps a second (fp32, fused AdamW) 40 steps were over before the outage was seen
# beside the other tests' load (2026-12-04): 80 leave ~8 s from the stop to the return.
STEPS = 80
# The store goes down once rank 0 reports this step, and comes back once training
# went at least DOWN_STEPS steps further (and RunLogger said it spools).
STOP_AT_STEP = 5
DOWN_STEPS = 10
# What RunLogger writes on rank 0's stderr (stoker/tracking/writer.py).
OUTAGE_TEXT = "does not answer"
BACK_TEXT = "answers again: replayed "
TRAINER_KEYS = ["loss", "lr"]
# The whole test, `stoker run` included, on a loaded 2-core machine.
DEADLINE_S = 300
# The store's outage is the subject, not the numerics: fp32, since bf16 autocast on a CPU
# without native bf16 (no AVX-512 BF16) is emulated (measured: 1.5 against 5.7 samples/s
# for the tiny model on 2 cores, where 150 steps then took longer than DEADLINE_S).
FAST = ["train.precision=fp32"]


def poll(what: str, check: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> Any:
    """check()'s first truthy value, polled every 0.2 s; fails if `stoker run` exits or
    time runs out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert proc.poll() is None, f"`stoker run` exited {proc.returncode} before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.2)


def spans(steps: set[int]) -> str:
    """{1, 2, 3, 7} -> '1-3, 7'."""
    parts: list[str] = []
    for step in sorted(steps):
        if parts and parts[-1].split("-")[-1] == str(step - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{step}"
        else:
            parts.append(str(step))
    return ", ".join(parts)


def run_dir(home: Path) -> Path | None:
    found = sorted((home / "runs").glob("*/"))
    return found[0] if len(found) == 1 else None


def progress_step(folder: Path) -> int:
    """Rank 0's last logged step; 0 before the first."""
    try:
        return int(json.loads((folder / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def rank0_log(folder: Path) -> str:
    try:
        return (folder / "logs" / "r0" / "rank-0.log").read_text(errors="replace")
    except OSError:
        return ""


def test_tracking_server_outage_mid_run_loses_and_repeats_no_step(tmp_path: Path) -> None:
    began = time.monotonic()
    server = RestartableServer(tmp_path / "server")
    server.folder.mkdir()
    proxy = TcpProxy(server.port)
    home = Path(os.environ["STOKER_HOME"])
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc: subprocess.Popen[bytes] | None = None
    try:
        server.start()
        proxy.up()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [STOKER, "run", f"train.steps={STEPS}", "train.log_every=1", *FAST, "--json"],
                env={**os.environ, "MLFLOW_TRACKING_URI": proxy.url},
                cwd=tmp_path,
                stdout=out,
                stderr=err,
            )
        try:
            # Synthetic data on first use (~20 s), then the ranks start.
            folder: Path = poll("the run folder", lambda: run_dir(home), 150, proc)
            poll("step 1", lambda: progress_step(folder), 150, proc)
            first_step_s = time.monotonic() - began
            poll(f"step {STOP_AT_STEP}", lambda: progress_step(folder) >= STOP_AT_STEP, 60, proc)

            step_at_stop = progress_step(folder)
            down_at = time.monotonic()
            proxy.down()  # mid-run, possibly mid-request
            stopped_s = time.monotonic() - down_at
            poll(
                "outage warning in rank 0's log", lambda: OUTAGE_TEXT in rank0_log(folder), 60, proc
            )
            poll(
                f"{DOWN_STEPS} steps with the store down",
                lambda: progress_step(folder) >= step_at_stop + DOWN_STEPS,
                90,
                proc,
            )
            spool = folder / "mlflow-spool-0.jsonl"
            assert spool.is_file() and spool.stat().st_size > 0, "nothing spooled in the outage"
            restart_at = time.monotonic()
            proxy.up()
            back_at = time.monotonic()
            step_at_restart = progress_step(folder)
            assert step_at_restart < STEPS, (
                f"the run reached step {step_at_restart} of {STEPS} before the store came "
                "back: raise STEPS"
            )
            # RunLogger retries with a backoff of up to 30 s: it replays while the run
            # trains, or in close().
            while proc.poll() is None and BACK_TEXT not in rank0_log(folder):
                time.sleep(0.2)
            step_at_replay = progress_step(folder) if proc.poll() is None else None
            proc.wait(timeout=max(30.0, DEADLINE_S - (time.monotonic() - began)))
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            raise AssertionError(
                f"{exc}\n--- stderr of stoker run ---\n{err_path.read_text()[-4000:]}"
            ) from exc
        stdout, stderr = out_path.read_text(), err_path.read_text()
        context = f"\n--- stderr ---\n{stderr[-4000:]}\n--- stdout ---\n{stdout[-2000:]}"
        assert proc.returncode == 0, f"`stoker run` exited {proc.returncode}{context}"
        summary = json.loads(stdout.strip().splitlines()[-1])
        assert summary["state"] == "COMPLETED" and summary["step"] == STEPS, f"{summary}{context}"
        assert Path(summary["run_dir"]) == folder

        log = rank0_log(folder)
        assert log.count(OUTAGE_TEXT) == 1, log[-4000:]
        back_lines = [line for line in log.splitlines() if BACK_TEXT in line]
        assert len(back_lines) == 1, f"RunLogger never replayed the spool:\n{log[-4000:]}"
        replayed = int(back_lines[0].split(BACK_TEXT)[1].split()[0])
        assert replayed > 0, back_lines[0]
        left = spool.read_text().splitlines() if spool.exists() else []
        assert not left, f"{len(left)} batches left in {spool} after the run"

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=server.url)  # the server, not the proxy
        run = client.get_run(summary["run_id"])
        assert run.info.status == "FINISHED", run.info.status
        assert set(TRAINER_KEYS) <= set(run.data.metrics), sorted(run.data.metrics)
        for key in sorted(run.data.metrics):
            logged = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            repeated = {s: n for s, n in Counter(logged).items() if n > 1}
            assert not repeated, f"{key}: steps logged more than once: {repeated}"
            # The trainer's metrics: one point per step (system/checkpoint/*: per committed
            # save; system/<node>/*: the nodes' samplers, by time).
            group = key.split("/")[1] if key.startswith("system/") else ""
            if group in ("", "throughput", "time", "stragglers", "data", "memory"):
                missing = spans(set(range(1, STEPS + 1)) - set(logged))
                assert sorted(logged) == list(range(1, STEPS + 1)), (
                    f"{key}: steps {missing} of 1-{STEPS} are not in MLflow (the store was down "
                    f"from step {step_at_stop} to step {step_at_restart}; {back_lines[0]})"
                )
        # Each committed save is also an external logged model `step-<N>`, once.
        history = client.get_metric_history(run.info.run_id, "system/checkpoint/bytes")
        saves = [m.step for m in history]
        found = client.search_logged_models(
            [run.info.experiment_id], f"source_run_id = '{run.info.run_id}'"
        )
        names = sorted(m.name for m in found if m.name.startswith("step-"))
        assert names == sorted(f"step-{s}" for s in saves), (names, saves)
        replay_at = f"at step {step_at_replay}" if step_at_replay else "in close()"
        print(
            f"\nfirst step after {first_step_s:.0f} s; store stopped at step {step_at_stop} "
            f"(took {stopped_s:.1f} s), back at step {step_at_restart} (start took "
            f"{back_at - restart_at:.1f} s; down {back_at - down_at:.1f} s); replayed "
            f"{replayed} points {replay_at}; {time.monotonic() - began:.0f} s in all"
        )
    finally:
        if proc is not None and proc.poll() is None:  # failed mid-run: stop the ranks too
            from stoker.launcher.local.backend import cancel_local

            for folder in (home / "runs").glob("*/"):
                cancel_local(folder)
            proc.kill()
            proc.wait()
        proxy.down()
        server.stop()
