"""The kernel benchmark's harness, run on the CPU through `stoker bench
kernels`: its result document, its byte models and its merging of runs. Its
figures mean something only on a GPU (benchmarks/results/kernels-<gpu>-*.json).
The command runs in the test process (`stoker_text`, stoker imported from this
checkout, as GPU nodes run these tests without installing it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stoker.kernels.bench import cases, run
from tests.clirun import stoker_text

SMALL = {"tokens": [64], "hidden": [128], "vocab": [256]}


@pytest.mark.usefixtures("one_torch_thread")
def test_bench_kernels_writes_the_result_document(tmp_path: Path) -> None:
    result = stoker_text(
        "bench", "kernels", "--device", "cpu", "--tokens", "64", "--hidden", "128",
        "--vocab", "256", "--baselines", "eager", "--reps", "1", "--warmup", "0",
        "--out", str(tmp_path), "--json", check=True,
    )  # fmt: skip
    doc = json.loads(result.stdout)
    # Said before the minutes it takes on a CPU: its figures are no speed.
    assert "no GPU here" in result.stderr and "say nothing about speed" in result.stderr
    assert {"device", "torch", "triton", "copy_gbps", "rows"} <= doc.keys()
    assert doc["copy_gbps"] > 0
    written = json.loads(Path(doc["path"]).read_text())
    assert Path(doc["path"]).name == f"kernels-cpu-{doc['date']}.json"
    assert written["rows"] == doc["rows"]
    got = {(r["kernel"], r["mode"]) for r in doc["rows"]}
    assert got == {(k, m) for k in cases.CASES for m in cases.MODES}
    for row in doc["rows"]:
        assert {"kernel", "mode", "shape", "dtype", "ms", "gbps", "pct_copy_bw"} <= row.keys()
        assert row["dtype"] == "bfloat16"
        assert row["ms"]["stoker"] > 0 and row["ms"]["eager"] > 0
        # Rounded to 3 decimals in the document (a slow interpreter run gives 0.02x).
        assert row["speedup"]["eager"] == pytest.approx(
            row["ms"]["eager"] / row["ms"]["stoker"], rel=1e-2, abs=6e-4
        )
        gbps = row["bytes"] / (row["ms"]["stoker"] * 1e-3) / 1e9
        assert row["gbps"] == pytest.approx(gbps, rel=1e-2, abs=0.1)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_forward_byte_model_counts_the_big_tensors(name: str) -> None:
    """The declared forward bytes equal the bytes of the inputs read and the
    outputs written, leaving out the small per-channel and per-row vectors and
    the fp32 tables (rope's cos/sin; a fraction of q at real head counts)."""
    case = cases.CASES[name]
    shape = case.shapes(*SMALL.values())[0]
    inputs = case.make(shape, torch.bfloat16, torch.device("cpu"))
    outs = case.eager.call(*inputs.args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    tensors = [t for t in (*inputs.args, *outs) if isinstance(t, torch.Tensor)]
    biggest = max(t.numel() for t in tensors)
    big = [t for t in tensors if t.numel() * 8 > biggest and t.dtype == torch.bfloat16]
    assert case.bytes(shape, 2, "fwd") == sum(t.numel() * t.element_size() for t in big)


def test_results_of_several_runs_add_up(tmp_path: Path) -> None:
    def doc(kernel: str, ms: float) -> dict:
        row = {"kernel": kernel, "mode": "fwd", "shape": {"tokens": 1}, "dtype": "bfloat16",
               "ms": {"stoker": ms}, "speedup": {}}  # fmt: skip
        return {"device_slug": "h100", "date": "2026-11-21", "rows": [row]}

    run.write_result(doc("rms_norm", 1.0), tmp_path)
    run.write_result(doc("swiglu", 2.0), tmp_path)
    path = run.write_result(doc("rms_norm", 3.0), tmp_path)
    rows = json.loads(path.read_text())["rows"]
    assert sorted((r["kernel"], r["ms"]["stoker"]) for r in rows) == [
        ("rms_norm", 3.0),
        ("swiglu", 2.0),
    ]


def test_bad_options_name_the_value(tmp_path: Path) -> None:
    result = stoker_text("bench", "kernels", "--device", "cpu", "--kernels", "rms_nrom")
    assert result.returncode == 2 and "'rms_nrom'" in result.stderr
    result = stoker_text("bench", "kernels", "--device", "cpu", "--tokens", "4k")
    assert result.returncode == 2 and "--tokens '4k'" in result.stderr


def test_device_slug_names_the_gpu() -> None:
    assert run.device_slug(torch.device("cpu")) == "cpu"
    names = {
        "NVIDIA H100 80GB HBM3": "h100",
        "NVIDIA H200": "h200",
        "NVIDIA A100-SXM4-80GB": "a100",
        "NVIDIA GeForce RTX 4090": "nvidia-geforce-rtx-4090",
    }
    assert {name: run.slug_of_name(name) for name in names} == names
