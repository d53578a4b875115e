"""benchmarks/insights.py at a small size: it runs, reports every timing against the
ledger read, and writes its result document with the machine. The figures mean
something only at the default size (benchmarks/results/insights-*.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "insights.py"


def test_the_benchmark_writes_its_result_document(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--jobs", "300", "--repeats", "2", "--recompute", "20",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "300 jobs in the report" in result.stdout and "target met" in result.stdout
    [path] = tmp_path.glob("insights-*.json")
    document = json.loads(path.read_text())
    assert document["jobs"] == 300 and document["target_met"] is True
    assert {"insights", "ledger read (floor)", "insights CLI", "html", "prometheus",
            "recompute (baseline)"} <= document["median_s"].keys()  # fmt: skip
    assert document["machine"]["cores"] and document["ratios"]["recompute_over_insights"] > 0
