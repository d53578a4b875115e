"""The names of the metrics stoker logs to MLflow, in one place: the runtime writes
them, the launcher's insights and status read them, and the MLflow UI groups every
`system/...` name under its System metrics. These strings are a public interface
(dashboards and queries name them): change none.

A leaf: no import of stoker, nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping

# The training metrics of a log step (the built-in trainer; an own loop logs its own).
LOSS = "loss"
EVAL_LOSS = "eval_loss"
GRAD_NORM = "grad_norm"
LR = "lr"
MFU = "mfu"
SKIPPED_NONFINITE_STEPS = "skipped_nonfinite_steps"

# Time per step, averaged over the log window.
STEP_S = "system/time/step_s"
DATA_WAIT_S = "system/time/data_wait_s"
FWD_BWD_S = "system/time/fwd_bwd_s"
OPTIMIZER_S = "system/time/optimizer_s"

# Per GPU (rank) over the log window.
SAMPLES_PER_S = "system/throughput/samples_per_s"
TOKENS_PER_S = "system/throughput/tokens_per_s"

PEAK_GPU_MEMORY_GB = "system/memory/peak_gb"
PEAK_RSS_GB = "system/memory/peak_rss_gb"

SKIPPED_SAMPLES = "system/data/skipped_samples"


def loader_counter(name: str) -> str:
    """A counter of the loader's LoaderStats (`system/data/<name>`), per log window."""
    return f"system/data/{name}"


def source_samples(source: str) -> str:
    """Samples read so far from data set `source` of a mixture, over all ranks."""
    return f"data/source/{source}/samples"


def source_epochs(source: str) -> str:
    return f"data/source/{source}/epochs"


# The slowest rank of the log window (stoker/runtime/observe/stragglers.py).
STRAGGLER_STEP_S_MIN = "system/stragglers/step_s_min"
STRAGGLER_STEP_S_MEDIAN = "system/stragglers/step_s_median"
STRAGGLER_STEP_S_MAX = "system/stragglers/step_s_max"
STRAGGLER_RANK = "system/stragglers/slowest_rank"
STRAGGLER_RATIO = "system/stragglers/slowest_ratio"
STRAGGLER_DATA_WAIT_S = "system/stragglers/slowest_data_wait_s"
STRAGGLER_DATA_WAIT_S_MEDIAN = "system/stragglers/data_wait_s_median"

# One checkpoint save, at its step.
CHECKPOINT_BYTES = "system/checkpoint/bytes"
CHECKPOINT_BLOCKING_S = "system/checkpoint/blocking_s"
CHECKPOINT_BACKGROUND_S = "system/checkpoint/background_s"
CHECKPOINT_BYTES_PER_S = "system/checkpoint/bytes_per_s"


def checkpoint_metrics(size: float, blocking_s: float, background_s: float) -> dict[str, float]:
    """The `system/checkpoint/*` metrics of one save: its bytes, how long training waited
    for it, how long the rest took, and bytes per second of the save, start to commit
    (left out for a save that took no time)."""
    values = {
        CHECKPOINT_BYTES: float(size),
        CHECKPOINT_BLOCKING_S: float(blocking_s),
        CHECKPOINT_BACKGROUND_S: float(background_s),
    }
    seconds = float(blocking_s) + float(background_s)
    if seconds > 0:
        values[CHECKPOINT_BYTES_PER_S] = float(size) / seconds
    return values


def node_metric(node: str, name: str) -> str:
    """A node's own reading (stoker/tracking/system_metrics.py): `system/<node>/<name>`."""
    return f"system/{node}/{name}"


# A job's time account (stoker/job_time.py), at its end.
GOODPUT = "system/goodput/goodput"
ALLOCATED_RANK_HOURS = "system/goodput/allocated_rank_hours"
PRODUCTIVE_RANK_HOURS = "system/goodput/productive_rank_hours"
QUEUE_AFTER_REQUEUE_S = "system/goodput/queue_after_requeue_s"
STARTS = "system/goodput/starts"


def lost_rank_hours(cause: str) -> str:
    return f"system/goodput/lost_{cause}_rank_hours"


def goodput_metrics(
    *,
    allocated_rank_h: float,
    productive_rank_h: float,
    queue_after_requeue_s: float,
    starts: float,
    goodput: float | None,
    lost_rank_h: Mapping[str, float],
) -> dict[str, float]:
    """A job's time account as metrics: what the runtime logs at the end of its last
    start, and what the launcher logs for a job the runtime could not (the same keys)."""
    out = {
        ALLOCATED_RANK_HOURS: allocated_rank_h,
        PRODUCTIVE_RANK_HOURS: productive_rank_h,
        QUEUE_AFTER_REQUEUE_S: queue_after_requeue_s,
        STARTS: starts,
    }
    if goodput is not None:
        out[GOODPUT] = goodput
    for cause, hours in lost_rank_h.items():
        out[lost_rank_hours(cause)] = hours
    return out
