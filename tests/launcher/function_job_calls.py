"""Functions the function-job tests submit (tests/launcher/test_function_jobs.py),
pickled by value as a user's script's functions are (cloudpickle, `__main__`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission


def add_on_every_rank(a: int, b: int, *, scale: int = 1) -> dict[str, Any]:
    """What global rank 0 returns, with the rank it ran on: each task runs it."""
    return {"sum": (a + b) * scale, "rank": os.environ.get("RANK"),
            "world": os.environ.get("WORLD_SIZE")}  # fmt: skip


def raise_bad_input(value: str) -> None:
    raise ValueError(f"bad input: {value}")


class CountTo(Checkpointable):
    """Counts to `total`, one step every STEP_S, rank 0 writing each step to `progress`;
    on a stop, its checkpoint is the call that continues from the next step."""

    STEP_S = 0.5

    def __init__(self) -> None:
        self.next_step = 0

    def __call__(self, total: int, progress: str, start: int = 0) -> dict[str, Any]:
        for step in range(start, total):
            self.next_step = step
            time.sleep(self.STEP_S)
            if os.environ.get("RANK") == "0":
                Path(progress).write_text(f"{os.environ.get('STOKER_RESTART')} {step}\n")
            self.next_step = step + 1
        return {"started_at": start, "restart": os.environ.get("STOKER_RESTART")}

    def checkpoint(self, total: int, progress: str, start: int = 0) -> DelayedSubmission:
        return DelayedSubmission(self, total, progress, self.next_step)
