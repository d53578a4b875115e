"""Part f: a short run of the tiny experiment on cuda through the runtime's entry point
(`stoker run`, one rank), with tracking to a local folder (`tracking.uri: none`:
metrics in the run folder, no MLflow, which the GPU machine lacks) on the synthetic
latent set (`data.modalities: [latent]`: made without PyAV). It passes when the run
exits 0, every step's loss is in the metrics file and its checkpoint is committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu_check.result import PartResult

REPO = Path(__file__).resolve().parents[2]
STEPS = 20


def overrides(steps: int) -> list[str]:
    return [
        "tracking.uri=none",
        "data.modalities=[latent]",
        "data.num_workers=0",
        "train.sample_every=0",
        f"train.steps={steps}",
        f"checkpoint.every={steps}",
    ]


def loss_steps(home: Path) -> list[int]:
    """The steps with a loss in the runs' metrics.jsonl (stoker/tracking/file_logger.py)."""
    steps = []
    for path in sorted(home.rglob("metrics.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            steps += [point[3] for point in record.get("m", []) if point[0] == "loss"]
    return steps


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "run", dry_run=dry_run)
    home = Path(os.environ["STOKER_HOME"])
    steps = 4 if dry_run else STEPS
    # One rank, on cuda:0 (job.gpus_per_node=1: as run on an H200, 2026-11-27).
    one_rank = ["--nproc", "1"] if dry_run else ["job.gpus_per_node=1"]
    command = [sys.executable, "-m", "stoker", "run", *one_rank, *overrides(steps)]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, text=True)
    seconds = time.perf_counter() - began
    losses = loss_steps(home)
    committed = sorted(p.parent.name for p in home.rglob("COMMIT.json"))
    row = {
        "command": " ".join(command[1:]),
        "exit_code": done.returncode,
        "seconds": round(seconds, 1),
        "device": "cpu" if dry_run else torch.cuda.get_device_name(0),
        "loss_steps": losses,
        "loss_records": len(losses),
        "committed": committed,
    }
    result.add_row(row)
    print(row, flush=True)
    ok = done.returncode == 0 and len(losses) > 0 and bool(committed)
    result.check(
        "tiny run on the device",
        "exit 0, losses logged, checkpoint committed",
        f"exit {done.returncode}, {len(losses)} loss records, committed {committed}",
        ok,
    )
    result.set(summary={"exit": done.returncode, "s": round(seconds, 1)})
    if not ok:
        raise SystemExit("the tiny run did not train, log and checkpoint: see the log")
    result.finish()
