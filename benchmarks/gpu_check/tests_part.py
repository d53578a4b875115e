"""Part d: the suite's GPU-only tests (marked `gpu`, benchmarks/gpu_check/gpu_tests.py)
with mlflow, av, soundfile and submitit blocked, then the kernel tests, which on a GPU
add the real DiT shapes and run the compiled kernels (on a CPU they run in Triton's
interpreter in the suite itself, so the dry run runs the GPU-only ones alone)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.gpu_tests import GPU_TEST_PATHS
from benchmarks.gpu_check.result import PartResult

REPO = Path(__file__).resolve().parents[2]
_OUTCOME = re.compile(r"\b(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


def run_pytest(result: PartResult, label: str, args: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs", *args]
    counts: dict[str, Any] = {
        "suite": label,
        "command": " ".join(command[1:]),
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "errors": 0,
        "failures": [],
    }
    result.add_row(counts)
    proc = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        found = _OUTCOME.search(line)
        node = next((w for w in line.split() if "::" in w), None)
        if not found or node is None:
            continue
        outcome = found.group(1)
        key = {
            "PASSED": "passed",
            "XPASS": "passed",
            "FAILED": "failed",
            "SKIPPED": "skipped",
            "XFAIL": "skipped",
            "ERROR": "errors",
        }[outcome]
        counts[key] += 1
        if key in ("failed", "errors"):
            counts["failures"].append(node)
        result.write()
    counts["exit_code"] = proc.wait()
    result.write()
    return counts


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "tests", dry_run=dry_run)
    gpu = run_pytest(result, "gpu-only", ["-m", "gpu", *GPU_TEST_PATHS])
    suites = [gpu]
    if not dry_run:
        args = ["tests/kernels"]
        if importlib.util.find_spec("xdist") is not None and torch.cuda.is_available():
            args = ["-n", "8", *args]  # compiles are CPU work: 16 cores
        suites.append(run_pytest(result, "kernels", args))
    summary = {
        s["suite"]: f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
        for s in suites
    }
    result.set(summary=summary)
    for s in suites:
        # pytest exits 0 (all passed or skipped) or 1 (a failure); 5 would be "no test".
        ok = s["exit_code"] == 0 and not s["failed"] and not s["errors"]
        result.check(
            f"{s['suite']} tests pass",
            "no failure, no error",
            f"{s['passed']} passed, {s['failed']} failed, {s['errors']} errors",
            ok,
        )
    if not all(c["met"] for c in result.doc["checks"]):
        raise SystemExit("a test failed: see the part's log")
    result.finish()
