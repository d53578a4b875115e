"""`stoker run` as on the GPU machine with no network (scripts/gpu-check): mlflow, av,
soundfile and submitit cannot be imported (benchmarks/gpu_check/import_blocker makes
their import fail in every process), `tracking.uri=none` records to the run folder and
`data.modalities=[latent]` trains on the synthetic latent set, made here on first use.
One rank (on the GPU where there is one), 4 steps: it trains, checkpoints, exits 0, and
metrics.jsonl has the loss of every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.checkpoint.commit import verify
from tests.clirun import stoker

REPO = Path(__file__).resolve().parents[2]
BLOCKER = REPO / "benchmarks" / "gpu_check" / "import_blocker"
BLOCKED = "mlflow,av,soundfile,submitit,moto"


@pytest.mark.fresh_home  # asserts that no MLflow store is made
def test_one_rank_trains_on_synthetic_latents_without_mlflow_or_pyav(isolated_home: Path) -> None:
    assert (BLOCKER / "sitecustomize.py").is_file(), f"{BLOCKER} is missing"
    env = {
        "STOKER_BLOCK_IMPORTS": BLOCKED,
        "PYTHONPATH": os.pathsep.join([str(BLOCKER), str(REPO)]),
        "OMP_NUM_THREADS": "1",  # the rank's torch threads (its default: every core)
    }
    for module in ("mlflow", "av"):  # the blocker works in this environment
        tried = subprocess.run([sys.executable, "-c", f"import {module}"],
                               env={**os.environ, **env}, capture_output=True, text=True,
                               timeout=60, check=False)  # fmt: skip
        assert "blocked by STOKER_BLOCK_IMPORTS" in tried.stderr, tried.stderr
    result = stoker(
        "run", "--nproc", "1", "--json", "tracking.uri=none", "data.modalities=[latent]",
        "train.steps=4", "train.log_every=1", "train.sample_every=0", "data.num_workers=0",
        "data.prefetch_mb=1", env=env, timeout=300,
    )  # fmt: skip
    output = result.stderr + result.stdout
    assert result.returncode == 0, output[-4000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED" and summary["step"] == 4 and summary["run_id"] is None
    run_dir = Path(summary["run_dir"])
    logs = "".join(p.read_text() for p in (run_dir / "logs").rglob("*.log"))
    assert "blocked by STOKER_BLOCK_IMPORTS" not in output + logs  # nothing tried and caught it

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    loss = {p[3]: p[1] for r in records for p in r.get("m", ()) if p[0] == "loss"}
    assert sorted(loss) == [1, 2, 3, 4] and all(v == v for v in loss.values()), loss  # no NaN
    assert records[-1]["status"] == "FINISHED"
    (checkpoint,) = [r["lm"] for r in records if "lm" in r]
    assert checkpoint["params"]["uri"] == str(run_dir / "checkpoints" / "step-4")
    assert verify(checkpoint["params"]["uri"], full=True) == []  # committed and whole
    (data,) = [r["ds"][0] for r in records if "ds" in r]
    assert "synth-latent-64x64-8fps-16000hz-1ch-1s-256" in data["source"]

    home = isolated_home / ".stoker"
    assert not (home / "mlflow").exists()  # no store was made
    assert f"metrics: {run_dir / 'metrics.jsonl'}" in result.stderr
