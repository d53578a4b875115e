"""Where a start's time goes, recorded by global rank 0 as the start runs: one JSON
object a line in `<run folder>/accounting/r<restart>.jsonl`, appended and flushed, so
a start that is killed leaves every line it wrote (a line cut short by the kill is
the last one, and readers skip it).

    {"kind": "start", "at": T, "restart": R, "start_step": S, "ranks": N, "host": H,
     "marks": {"process": T, "session": T,       when rank 0's process began, had
               "joined": T, "tracking": T}}      imported torch, joined the others,
                                                  opened its MLflow run (the start line
                                                  itself: model built, checkpoint loaded)
    {"kind": "first_step", "at": T}              the first step of this start begins
    {"kind": "window", "at": T, "step": S, "steps": n, "step_s": s, "data_s": s,
     "checkpoint_s": s, "sample_s": s,            one per log step: the window's rank-0
     "samples_per_s": x, "mfu": x,                seconds in steps, waiting for data, held
     "straggler": {"rank": r, "host": H,          by checkpoint saves, drawing samples; its
                   "ratio": x}}                   throughput per rank and MFU (where known);
                                                  the slowest rank where it was over
                                                  STRAGGLER_RATIO times the median
    {"kind": "commit", "at": T, "step": S}       checkpoint step-S committed (from the
                                                  checkpoint thread)
    {"kind": "end", "at": T, "step": S, "status": "FINISHED" | "REQUEUE" | ...,
     "checkpoint_s": s, "sample_s": s}           the same seconds since the last window

Times are epoch seconds (time.time()); durations are rank 0's, as measured by the
trainer's own clocks. stoker.job_time reads these files (a line cut short by
a kill, and any after it, left out), the batch script's `attempts` and the watchdog's
hang.json into the job's time account (goodput and the time lost by cause).
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker import metric_names as names
from stoker.protocol import ACCOUNTING_DIR, STRAGGLER_RATIO
from stoker.runtime.observe.metrics_sink import MetricsSink

if TYPE_CHECKING:
    from stoker.runtime.observe.stragglers import Slowest


def account_path(run_dir: Path, restart: int) -> Path:
    return Path(run_dir) / ACCOUNTING_DIR / f"r{restart}.jsonl"


class StartAccount:
    """The appender of one start's accounting lines; a no-op off global rank 0."""

    def __init__(self, run_dir: Path, *, restart: int, enabled: bool) -> None:
        self.path = account_path(run_dir, restart) if enabled else None
        self.restart = restart
        self._first_step_written = False

    def _write(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"kind": kind, "at": round(time.time(), 3), **fields})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Flushed, not fsync'd: a killed process keeps what reached the page cache;
            # an fsync per log step would cost a round trip on a shared filesystem.
            with open(self.path, "a") as out:
                out.write(line + "\n")
        except OSError:
            pass  # an account that cannot be written must not stop the training

    def start(self, start_step: int, ranks: int, marks: Mapping[str, float] | None = None) -> None:
        """`marks`: when rank 0 reached each point of its start (the session's)."""
        self._write(
            "start",
            restart=self.restart,
            start_step=start_step,
            ranks=ranks,
            host=socket.gethostname(),
            **({"marks": {k: round(v, 3) for k, v in marks.items()}} if marks else {}),
        )

    def first_step(self) -> None:
        if not self._first_step_written:
            self._first_step_written = True
            self._write("first_step")

    def window(
        self,
        step: int,
        *,
        steps: int,
        step_s: float,
        data_s: float,
        checkpoint_s: float,
        sample_s: float,
        metrics: dict[str, float] | None = None,
        slowest: Slowest | None = None,
    ) -> None:
        extra: dict[str, Any] = {}
        for key, name in ((names.SAMPLES_PER_S, "samples_per_s"), (names.MFU, "mfu")):
            value = (metrics or {}).get(key)
            if value is not None and math.isfinite(value):
                extra[name] = round(value, 6)
        if slowest is not None and slowest.ratio > STRAGGLER_RATIO:
            extra["straggler"] = {
                "rank": slowest.rank,
                "host": slowest.host,
                "ratio": round(slowest.ratio, 3),
            }
        self._write(
            "window",
            step=step,
            steps=steps,
            step_s=round(step_s, 4),
            data_s=round(data_s, 4),
            checkpoint_s=round(checkpoint_s, 4),
            sample_s=round(sample_s, 4),
            **extra,
        )

    def committed(self, step: int) -> None:
        self._write("commit", step=step)

    def end(self, step: int, status: str, *, checkpoint_s: float, sample_s: float) -> None:
        """The start's last line; `checkpoint_s` and `sample_s` since the last window (the
        final save comes after the last log step)."""
        self._write(
            "end",
            step=step,
            status=status,
            checkpoint_s=round(checkpoint_s, 4),
            sample_s=round(sample_s, 4),
        )


def log_job_time(sink: MetricsSink, run_dir: Path, step: int) -> None:
    """The job's time account (stoker.job_time, every start's) as the run's
    `system/goodput/...` metrics at `step`, and its goodput as the tag `stoker.goodput`;
    one line printed."""
    from stoker.job_time import job_time

    account = job_time(run_dir)
    metrics = account.metrics()
    sink.log_metrics(metrics, step)
    goodput = account.goodput
    if goodput is None:
        return
    sink.set_tags({"stoker.goodput": f"{goodput:.3f}"})
    lost = sorted(account.lost_rank_s().items(), key=lambda item: -item[1])[:3]
    shown = ", ".join(f"{cause} {value / 3600:.3g}" for cause, value in lost if value > 0)
    print(
        f"goodput {goodput:.1%} of {account.allocated_rank_s / 3600:.3g} rank-hours"
        + (f"; lost rank-hours: {shown}" if shown else ""),
        flush=True,
    )
