"""The step benchmark's harness, run on the CPU through `stoker bench step`: its
result document, its arithmetic, its merging of runs and its errors. Its
figures mean something only on a GPU (benchmarks/results/step-<gpu>-*.json)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from stoker.cli.app import app
from stoker.errors import StokerError
from stoker.runtime import bench_step

REPO = Path(__file__).resolve().parents[2]


def python(*args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` from this checkout, as a GPU node runs it (PYTHONPATH=.). Torch and
    inductor's compiler on one thread each: the step times mean nothing on the CPU, and
    a second thread spins on a loaded 2-core machine."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip


def test_bench_step_writes_the_result_document(tmp_path: Path) -> None:
    # Tiny shapes, one sample: 0.5 s at 8 fps of 64x64 is 2 x 8 x 8 = 128 video
    # tokens, 8000 samples / 400 = 20 audio tokens. Compiling the tiny block
    # takes most of the time (about 50 s with a cold inductor cache under load).
    result = python(
        "-m", "stoker", "bench", "step", "--device", "cpu", "--size", "tiny",
        "--resolution", "64x64", "--clip-seconds", "0.5", "--batch-size", "1",
        "--steps", "2", "--warmup", "1", "--variants", "reference,compile",
        "--json", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    doc = json.loads(result.stdout)
    assert {"device", "device_slug", "date", "torch", "triton", "model", "batch_size"} <= set(doc)
    assert doc["device_slug"] == "cpu" and doc["target_mfu"] == 0.45
    assert doc["peak_flops"] is None and doc["batch_size"] == 1
    model = doc["model"]
    assert (model["arch"], model["size"], model["tokens_per_sample"]) == ("av_dit", "tiny", 148)
    data = bench_step.data_config(
        "av_dit", resolution=(64, 64), fps=8, clip_seconds=0.5, batch_size=1
    )
    assert model == bench_step.describe_model("av_dit", "tiny", data)  # the model's own counts

    path = Path(doc.pop("path"))
    assert path == tmp_path / f"step-cpu-{doc['date']}.json"
    assert json.loads(path.read_text()) == doc

    rows = {row["variant"]: row for row in doc["rows"]}
    assert list(rows) == ["reference", "compile"]
    assert [rows[v]["compiled"] for v in rows] == [False, True]
    for row in rows.values():
        assert row["backend"] == "reference"
        assert row["step_ms_min"] <= row["step_ms"] <= row["step_ms_max"]
        assert row["samples_per_s"] == pytest.approx(1 / (row["step_ms"] * 1e-3), rel=1e-3)
        tokens = row["samples_per_s"] * model["tokens_per_sample"]
        assert row["tokens_per_s"] == pytest.approx(tokens, rel=1e-3)
        flops = row["samples_per_s"] * model["flops_per_sample"]
        assert row["tflops"] == pytest.approx(flops / 1e12, rel=1e-3)
        assert row["mfu"] is None and row["peak_memory_gb"] is None  # the CPU has no peak
        assert math.isfinite(row["loss"]) and row["nonfinite_steps"] == 0
    ms = {v: rows[v]["step_ms"] for v in rows}
    # The document rounds ratios to 3 decimals (0.024 for a busy machine's 0.0243).
    assert rows["reference"]["speedup"] == {"reference": 1.0, "compile": pytest.approx(
        ms["compile"] / ms["reference"], rel=1e-2, abs=1e-3)}  # fmt: skip
    assert rows["compile"]["speedup"]["reference"] == pytest.approx(
        ms["reference"] / ms["compile"], rel=1e-2, abs=1e-3
    )


def test_runs_without_pydantic() -> None:
    """GPU nodes may have torch, triton, typer and rich only: the benchmark
    never imports stoker.config (pydantic)."""
    code = (
        "import sys; sys.modules['pydantic'] = None\n"
        "from stoker.runtime import bench_step\n"
        "doc = bench_step.run('av_dit', 'tiny', variants=['stoker'], steps=1, warmup=0,\n"
        "    resolution=(32, 32), clip_seconds=0.25, batch_size=1)\n"
        "print(doc['rows'][0]['backend'], doc['model']['tokens_per_sample'],\n"
        "      'stoker.config' in sys.modules)\n"
    )
    result = python("-c", code)
    assert result.returncode == 0, result.stderr[-4000:]
    # 0.25 s: 2 frames of 32x32 in 2x8x8 patches = 16 video tokens, 10 audio tokens.
    assert result.stdout.split() == ["reference", "26", "False"]


def doc(variant: str, ms: float, batch: int = 8) -> dict[str, Any]:
    row = {"variant": variant, "step_ms": ms}
    return {"device_slug": "h100", "date": "2026-11-21", "model": {"size": "1b"},
            "data": {}, "batch_size": batch, "activation_checkpointing": "none",
            "rows": bench_step.add_speedups([row])}  # fmt: skip


def test_runs_of_one_setup_add_up_and_other_setups_keep_their_file(tmp_path: Path) -> None:
    bench_step.write_result(doc("reference", 300.0), tmp_path)
    bench_step.write_result(doc("compile", 250.0), tmp_path)
    path = bench_step.write_result(doc("stoker", 200.0), tmp_path)
    rows = {r["variant"]: r for r in json.loads(path.read_text())["rows"]}
    assert {v: r["step_ms"] for v, r in rows.items()} == {
        "reference": 300.0, "compile": 250.0, "stoker": 200.0}  # fmt: skip
    assert rows["stoker"]["speedup"] == {"reference": 1.5, "compile": 1.25}
    assert rows["reference"]["speedup"] == {"reference": 1.0, "compile": pytest.approx(0.833)}

    other = bench_step.write_result(doc("stoker", 400.0, batch=16), tmp_path)
    assert other.name == "step-h100-2026-11-21-2.json"
    assert len(json.loads(path.read_text())["rows"]) == 3
    again = bench_step.write_result(doc("reference", 500.0, batch=16), tmp_path)
    assert again == other and len(json.loads(other.read_text())["rows"]) == 2


def test_stoker_means_the_reference_kernels_on_the_cpu() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert bench_step.resolved_backend("triton", cpu) == "reference"
    assert bench_step.resolved_backend("triton", cuda) == "triton"
    assert bench_step.resolved_backend("reference", cuda) == "reference"
    assert bench_step.variant("stoker+compile") == bench_step.Variant(
        "stoker+compile", kernels="triton", compiled=True
    )


def invoke(out: Path, *args: str) -> BaseException | None:
    # Small and short, should a bad value get through.
    small = ["--device", "cpu", "--size", "tiny", "--resolution", "32x32", "--variants",
             "reference", "--steps", "1", "--warmup", "0", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, ["bench", "step", *small, *args])
    return result.exception


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--variants", "reference,fast"], "'fast'"),
        (["--arch", "gpt"], "arch 'gpt'"),
        (["--activation-checkpointing", "some"], "'some'"),
        (["--resolution", "256"], "--resolution '256'"),
        (["--resolution", "60x64"], "data.resolution [60, 64]"),
        (["--clip-seconds", "0.1"], "data.clip_seconds 0.1"),
        (["--size", "xl"], "'xl'"),
    ],
)
def test_bad_options_name_the_value(args: list[str], named: str, tmp_path: Path) -> None:
    error = invoke(tmp_path, *args)
    assert isinstance(error, StokerError), error
    assert named in str(error) and error.fix
    assert not any(tmp_path.iterdir())


def test_bad_variant_exits_2_with_the_message() -> None:
    result = python("-m", "stoker", "bench", "step", "--device", "cpu", "--variants", "fast")
    assert result.returncode == 2
    assert "'fast'" in result.stderr and "stoker, reference, compile" in result.stderr
