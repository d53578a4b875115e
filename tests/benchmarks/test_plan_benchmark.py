"""benchmarks/plan.py on the tiny experiment: it runs, compares the pooled plan with the
one-process baseline and the parameter count with the traced peak, and writes its
result document with the machine. The figures mean something only for the 1b preset
(benchmarks/results/plan-*.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "plan.py"


def test_the_benchmark_writes_its_result_document(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--experiment", str(REPO / "examples" / "tiny.yaml"),
         "--gpus-per-node", "2", "--gpu", "A100", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # Whether the 60 s target is met is a figure of the machine (the suite runs this
    # beside the cluster tests, at nice 19: 112.8 s seen); the benchmark's contract is
    # that its verdict, its document and its exit status agree.
    [path] = tmp_path.glob("plan-*.json")
    document = json.loads(path.read_text())
    met = document["target_met"]
    assert result.returncode == (0 if met else 1), result.stdout[-2000:] + result.stderr[-4000:]
    assert ("target met" if met else "target missed") in result.stdout
    assert "one process (baseline)" in result.stdout
    assert document["machine"]["cores"] and document["target"]["world"] == 2
    assert document["ratios"]["one_process_over_pooled"] > 0
    assert document["buckets"] and all(b["traced_over_counted"] > 1 for b in document["buckets"])
