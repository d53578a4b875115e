"""One timed run of a loader for benchmarks/loader.py, and the throughput summary of
a stream's runs: samples/s after the first batch, in wall time and in CPU time of the
process and its DataLoader workers."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stoker.data.stream.prefetch import auto_decode_threads

RATIO_TARGET = 1.0


@dataclass
class Run:
    pipeline: str
    workers: int
    repeat: int
    startup_s: float
    """Until the first batch: worker start-up and the first batch's work."""
    samples_timed: int
    """Samples after the first batch: what the rate counts."""
    samples: int
    elapsed_s: float
    samples_per_s: float
    cpu_s: float
    """CPU time of the main process and the workers while the rate was counted."""
    samples_per_cpu_s: float
    video_frames: int = 0
    decode_s: float = 0.0
    bytes_read: int = 0


class TreeCpu:
    """CPU seconds (user + system) of this process and the processes under it: the
    DataLoader workers, which forkserver starts as its children (Linux /proc)."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last: dict[int, float] = {}  # pid -> CPU seconds when last read

    def discover(self) -> None:
        """Find the processes under this one (call once the workers run)."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = self._stat(int(entry))
                if fields:
                    parents[int(entry)] = int(fields[1])
        found: set[int] = set()
        frontier = {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
            found |= frontier
        self.last = {pid: self.last.get(pid, 0.0) for pid in found}

    def read(self) -> float:
        """Total CPU seconds so far; a process that ended counts with its last reading."""
        for pid in self.last:
            fields = self._stat(pid)
            if fields:
                self.last[pid] = (int(fields[11]) + int(fields[12])) / self.tick
        return time.process_time() + sum(self.last.values())

    @staticmethod
    def _stat(pid: int) -> list[str] | None:
        """Fields of /proc/PID/stat after the command name: state, ppid, ..."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None


def drive(
    name: str,
    workers: int,
    repeat: int,
    batches: Iterator[dict[str, Any]],
    on_batch: Callable[[int, dict[str, Any]], None],
) -> Run:
    """Consume `batches`; time the samples after the first batch, in wall time and in
    CPU time of all processes (so a rate that load from elsewhere does not move)."""
    began = time.perf_counter()
    first_at = 0.0
    cpu = TreeCpu()
    cpu_at_first = 0.0
    timed = 0
    total = 0
    n = 0
    for n, batch in enumerate(batches):
        if n == 0:
            first_at = time.perf_counter()
            cpu.discover()
            cpu_at_first = cpu.read()
        else:
            timed += len(batch["key"])
            cpu.read()  # workers exit after the last batch: read them while they run
        total += len(batch["key"])
        on_batch(n, batch)
    elapsed = time.perf_counter() - first_at
    cpu_s = cpu.read() - cpu_at_first
    if n == 0:
        raise SystemExit(f"{name}: fewer than two batches; use more --clips or a smaller --batch")
    return Run(
        name,
        workers,
        repeat,
        startup_s=round(first_at - began, 3),
        samples_timed=timed,
        samples=total,
        elapsed_s=round(elapsed, 3),
        samples_per_s=round(timed / elapsed, 2),
        cpu_s=round(cpu_s, 3),
        samples_per_cpu_s=round(timed / cpu_s, 2),
    )


def summarize(runs: list[Run], worker_counts: list[int]) -> list[dict[str, Any]]:
    """Per worker count: medians over repeats; ratio from adjacent stoker/webdataset runs."""
    rows = []
    for workers in worker_counts:
        ours = [r for r in runs if r.workers == workers and r.pipeline == "stoker"]
        theirs = [r for r in runs if r.workers == workers and r.pipeline == "webdataset"]
        ratios = [a.samples_per_s / b.samples_per_s for a, b in zip(ours, theirs, strict=True)]
        cpu_ratios = [
            a.samples_per_cpu_s / b.samples_per_cpu_s for a, b in zip(ours, theirs, strict=True)
        ]
        w = max(1, workers)
        rows.append(
            {
                "workers": workers,
                "stoker_samples_per_s": round(statistics.median(r.samples_per_s for r in ours), 2),
                "webdataset_samples_per_s": round(
                    statistics.median(r.samples_per_s for r in theirs), 2
                ),
                "ratio": round(statistics.median(ratios), 3),
                "ratios": [round(x, 3) for x in ratios],
                "stoker_samples_per_cpu_s": round(
                    statistics.median(r.samples_per_cpu_s for r in ours), 2
                ),
                "webdataset_samples_per_cpu_s": round(
                    statistics.median(r.samples_per_cpu_s for r in theirs), 2
                ),
                "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                "stoker_startup_s": round(statistics.median(r.startup_s for r in ours), 2),
                "webdataset_startup_s": round(statistics.median(r.startup_s for r in theirs), 2),
                "stoker_frames_per_s_per_worker": round(
                    statistics.median(r.video_frames / r.elapsed_s / w for r in ours), 1
                ),
                # Decode threads each worker took (data.decode_threads: 0, the default),
                # as the loader works it out, in this process and environment.
                "stoker_decode_threads": auto_decode_threads(w),
                "stoker_decode_share": round(
                    statistics.median(r.decode_s / (r.elapsed_s * w) for r in ours), 3
                ),
                "stoker_bytes_read_per_sample": round(
                    statistics.median(r.bytes_read / r.samples for r in ours)
                ),
                "webdataset_bytes_read_per_sample": round(
                    statistics.median(r.bytes_read / r.samples for r in theirs)
                ),
            }
        )
    return rows


def print_throughput(rows: list[dict[str, Any]], repeats: int, what: str) -> None:
    print(f"\nloader throughput, samples/s (median of {repeats}; start-up excluded): {what}")
    print(
        f"{'workers':>7} | {'stoker':>7} {'wds':>7} {'ratio':>6} {'target':>9} | "
        f"{'per CPU-s: stoker':>17} {'wds':>6} {'ratio':>6} | {'start-up s':>11} | "
        f"{'frames/s/worker':>15} {'decode/worker':>13} {'threads':>7}"
    )
    for row in rows:
        mark = "ok" if row["ratio"] >= RATIO_TARGET else "MISS"
        startup = f"{row['stoker_startup_s']:.2f}/{row['webdataset_startup_s']:.2f}"
        print(
            f"{row['workers']:>7} | {row['stoker_samples_per_s']:>7.1f} "
            f"{row['webdataset_samples_per_s']:>7.1f} {row['ratio']:>6.2f} "
            f"{'>=' + format(RATIO_TARGET, 'g'):>4} {mark:<4} | "
            f"{row['stoker_samples_per_cpu_s']:>17.1f} {row['webdataset_samples_per_cpu_s']:>6.1f} "
            f"{row['cpu_ratio']:>6.2f} | {startup:>11} | "
            f"{row['stoker_frames_per_s_per_worker']:>15.1f} {row['stoker_decode_share']:>13.2f} "
            f"{row['stoker_decode_threads']:>7}"
        )
    print(
        "(start-up: stoker/webdataset, until the first batch; ratio: median of adjacent runs; "
        "decode/worker: decode seconds over a worker's seconds, summed over its decode "
        "threads, so above 1 when it decodes in several)"
    )
