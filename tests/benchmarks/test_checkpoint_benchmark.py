"""benchmarks/checkpoint.py at a tiny size: its result document and its
arithmetic. The figures mean something only at the default size, on the disk
that matters (benchmarks/results/checkpoint-*.json)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stoker.checkpoint.storage import WRITER_THREADS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "checkpoint.py"
TINY = ["--size-gb", "0.01", "--repeats", "2", "--writer-threads", f"1,{WRITER_THREADS}"]
MIB = 1 << 20


def bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run the benchmark into tmp_path; (the process, its result document)."""
    work, out = tmp_path / "disk", tmp_path / "results"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--dir", str(work), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # 1: a target missed, which a 10 MB state on a loaded machine may well do.
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-4000:]
    assert list(work.iterdir()) == [], "the benchmark left its folders behind"
    [path] = out.glob("checkpoint-*.json")
    return result, json.loads(path.read_text())


def check_document(doc: dict[str, Any], *, nproc: int) -> None:
    assert doc["benchmark"] == "checkpoint"
    machine = doc["machine"]
    assert {"host", "cpu", "cores", "torch", "device", "gpu", "memory_gb"} <= machine.keys()
    assert machine["filesystem"]["fstype"] not in ("", "?")
    config = doc["config"]
    assert (config["size_gb"], config["repeats"], config["nproc"]) == (0.01, 2, nproc)
    assert config["writer_threads"] == [1, WRITER_THREADS] and config["device"] == "cpu"

    # Bytes: the state is ~size_gb; every method writes it plus little overhead
    # (DCP's metadata and per-tensor headers, torch.save's zip records).
    sizes = doc["bytes"]
    state = sizes["state"]
    assert state == pytest.approx(0.01e9, rel=0.1)
    written = [sizes["async"], sizes["sync"], sizes["torch_save"], *sizes["dcp"].values()]
    for nbytes in written:
        assert state <= nbytes <= state * 1.05 + MIB
    assert sizes["checkpoint"] == sizes["async"]
    assert abs(sizes["sync"] - sizes["async"]) < 1024  # only the step in the JSON differs
    assert sizes["checkpoint"] <= sizes["disk"] < sizes["checkpoint"] + nproc

    runs = doc["runs"]
    assert [r["repeat"] for r in runs] == [0, 1]
    assert runs[0]["order"] != runs[1]["order"]  # rotated
    for run in runs:
        times = [run[k] for k in ("async_blocking_s", "async_background_s", "async_wait_s",
                                  "sync_s", "hash_s", "torch_save_s", "disk_s")]  # fmt: skip
        assert all(t > 0 for t in [*times, *run["dcp_write_s"].values()])
        assert set(run["dcp_write_s"]) == set(run["dcp_bytes"]) == {"1", str(WRITER_THREADS)}

    median_sync = statistics.median(r["sync_s"] for r in runs)
    assert doc["seconds"]["sync"] == pytest.approx(median_sync, abs=1e-3)
    gbps, ratios = doc["gbps"], doc["ratios"]
    assert all(v > 0 for v in gbps.values())
    first = runs[0]
    ours = str(WRITER_THREADS)  # stoker's writer: the throughput target is its
    write = first["dcp_bytes"][ours] / first["dcp_write_s"][ours]
    disk = first["disk_bytes"] / first["disk_s"]
    assert doc["ratios_by_repeat"]["write_vs_disk"][0] == pytest.approx(write / disk, abs=1e-3)
    block = first["async_blocking_s"] / first["sync_s"]
    assert doc["ratios_by_repeat"]["async_blocking_vs_sync"][0] == pytest.approx(block, abs=1e-3)

    targets = doc["targets"]
    assert set(targets) == {"async_blocking_vs_sync", "write_vs_disk", "committed_vs_disk"}
    assert targets["async_blocking_vs_sync"]["met"] == (ratios["async_blocking_vs_sync"] < 0.1)
    assert targets["write_vs_disk"]["met"] == (ratios["write_vs_disk"] >= 0.8)
    assert doc["meets_targets"] == {k: v["met"] for k, v in targets.items()}
    assert doc["ratios_of_best"].keys() >= targets.keys()


def test_benchmark_writes_its_result_document(tmp_path: Path) -> None:
    result, doc = bench(tmp_path, *TINY)
    check_document(doc, nproc=1)
    assert "async_blocking_vs_sync" in result.stdout
    assert result.returncode == (0 if all(doc["meets_targets"].values()) else 1)


def test_benchmark_on_two_ranks(tmp_path: Path) -> None:
    _, doc = bench(tmp_path, *TINY, "--nproc", "2")
    check_document(doc, nproc=2)


def test_help_names_the_options() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    for option in ("--size-gb", "--repeats", "--dir", "--writer-threads", "--nproc", "--out"):
        assert option in result.stdout
