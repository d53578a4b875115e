"""`python -m stoker.runtime.train --config FROZEN` started by hand (as torchrun
would, without `stoker submit`): one process, no MLFLOW_RUN_ID, so the
runtime creates its own run in the embedded store, with the params `stoker
submit` would have logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

# `python -m stoker.runtime.train ARGS`, then the garbage collector's state and what
# SIGUSR2 does while Python exits.
AS_MAIN_THEN_DISPOSITION = """
import gc, signal, sys
from stoker.runtime.train import main
code = main(sys.argv[1:])
print("collector on, start-up frozen:", gc.isenabled(), gc.get_freeze_count() > 100_000)
print("SIGUSR2 ignored after main:", signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN, flush=True)
sys.exit(code)
"""


def test_entry_point_creates_its_run_and_finishes(
    tmp_path: Path, isolated_home: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    data = synthetic_av_set(clips=8, size=(64, 64))  # 2 s clips at 8 fps
    config = tmp_path / "run" / "config.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({
        "job": {"name": "by-hand", "env": {"FOO": "1"}},
        "data": {"url": str(data), "batch_size": 2, "num_workers": 0, "prefetch_mb": 1},
        "train": {"steps": 2, "log_every": 1},
        "checkpoint": {"every": 1, "keep_last": 1, "upload_final": True},
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "STOKER_RUN"))}
    env["OMP_NUM_THREADS"] = "1"  # one torch thread (its default: every core)
    result = subprocess.run(
        [sys.executable, "-c", AS_MAIN_THEN_DISPOSITION, "--config", str(config)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished at step 2" in result.stdout
    # Python's exit would restore SIGUSR2's default action: a stop that came while a
    # finished rank exits would kill it and fail the job.
    assert result.stdout.splitlines()[-1] == "SIGUSR2 ignored after main: True"
    # Paused while torch, the runtime and mlflow imported; on again, with what they made
    # frozen, for the steps (stoker/process/gc_pause.py).
    assert result.stdout.splitlines()[-2] == "collector on, start-up frozen: True True"
    assert (config.parent / "checkpoints" / "step-2" / "COMMIT.json").is_file()
    assert not (config.parent / "checkpoints" / "step-1").exists()  # keep_last 1
    assert not (config.parent / "progress.json").exists()  # written only with STOKER_PROGRESS_FILE
    # The exit code, said before the slow way out (the batch script reads it, protocol.py).
    announced = json.loads((config.parent / "heartbeat" / "r0" / "rank-0.exit.json").read_text())
    assert announced["exit_code"] == 0

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{isolated_home / '.stoker' / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("stoker").experiment_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "by-hand"
    # Keyed as `stoker submit` logs them: free mappings key by key.
    assert run.data.params["job.env.FOO"] == "1" and run.data.params["train.steps"] == "2"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2]

    # Every committed save: metrics at its step and an external logged model;
    # upload_final: the consolidated weights as the logged model `final`.
    saves = client.get_metric_history(run.info.run_id, "system/checkpoint/bytes")
    assert [m.step for m in saves] == [
        1,
        2,
    ]
    models = {
        m.name: m
        for m in client.search_logged_models(
            [run.info.experiment_id], f"source_run_id = '{run.info.run_id}'"
        )
    }
    assert set(models) == {"step-1", "step-2", "final"}
    assert models["step-2"].tags["mlflow.model.isExternal"] == "true"
    assert models["step-2"].params["uri"] == str(config.parent / "checkpoints" / "step-2")
    from mlflow.artifacts import download_artifacts

    got = Path(download_artifacts(artifact_uri=models["final"].artifact_location,
                                  dst_path=str(tmp_path / "downloaded")))  # fmt: skip
    local = config.parent / "final-model" / "model.safetensors"
    assert (got / "model.safetensors").read_bytes() == local.read_bytes()
