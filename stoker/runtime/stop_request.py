"""When to stop early, and why: the launcher's stop protocol
(stoker/protocol.py) and termination.

A stop is requested by the stop file appearing (the batch script creates it
when SLURM signals the time limit or a preemption) or by SIGUSR2 sent to the
task. The trainer finishes the step, saves, and exits with EXIT_REQUEUE so
that the batch script requeues the job. SIGTERM (scancel, or the end of the
grace period) asks for the same, but the run is then over: KILLED.

Every rank must stop at the same step (they save together): the trainer
all-reduces `wanted()` each step.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType

from stoker.protocol import ENV_STOP_FILE


class StopRequest:
    def __init__(self, stop_file: Path | None = None) -> None:
        env_file = os.environ.get(ENV_STOP_FILE)
        self.stop_file = stop_file or (Path(env_file) if env_file else None)
        self.signalled = False
        self.terminated = False

    def install(self, *, term: bool = True) -> None:
        """Handle SIGUSR2 (and SIGTERM unless `term` is false) in the main thread: set a
        flag, return. The entry point handles SIGUSR2 before it imports torch, whose
        default action would kill a task asked to stop while it starts; SIGTERM keeps
        its default until training begins, as there is nothing to save before."""
        signal.signal(signal.SIGUSR2, self._on_usr2)
        if term:
            signal.signal(signal.SIGTERM, self._on_term)

    def _on_usr2(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = self.terminated = True

    def wanted(self) -> bool:
        """A stop was asked for, on this rank (a stat of the stop file)."""
        return self.signalled or bool(self.stop_file and self.stop_file.exists())
