"""What the array tasks of the data jobs (`stoker.data.jobs.encode_task`,
`stoker.data.jobs.pack_task`) share: the command line (`DST --work WORK_URL --task I`),
the stop request, errors printed as the CLI prints them, and the work file."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from stoker.data.write.location import open_location
from stoker.errors import StokerError
from stoker.protocol import ENV_STOP_FILE

Stop = Callable[[], bool]


class TaskStop:
    """A stop was requested: the batch script's stop file (time limit, preemption,
    requeue), or SIGUSR2 / SIGTERM. Asked between units of work."""

    def __init__(self) -> None:
        self.signalled = False
        env_file = os.environ.get(ENV_STOP_FILE)
        self.stop_file = Path(env_file) if env_file else None
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def __call__(self) -> bool:
        return self.signalled or bool(self.stop_file and self.stop_file.exists())


def task_main(
    prog: str, run: Callable[[str, str, int, Stop], int], argv: list[str] | None = None
) -> int:
    """Parse `DST --work WORK_URL --task I`, run `run(dst, work, task, stop)`; a
    StokerError is printed as `stoker: error:` / `stoker: fix:` lines (what `stoker why`
    shows) and exits 1."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("dst")
    parser.add_argument("--work", required=True, help="the work file: each task's shards")
    parser.add_argument("--task", type=int, required=True)
    ns = parser.parse_args(argv)
    stop = TaskStop()
    try:
        return run(ns.dst, ns.work, ns.task, stop)
    except StokerError as exc:
        print(f"stoker: error: {exc.message}", file=sys.stderr, flush=True)
        if exc.fix:
            print(f"stoker: fix: {exc.fix}", file=sys.stderr, flush=True)
        return 1


def read_work(work_url: str, task: int, again: str) -> tuple[dict[str, Any], list[int]]:
    """The work file and task `task`'s shard numbers; `again`: the command to submit anew."""
    fs, path, _ = open_location(work_url)
    try:
        work: dict[str, Any] = json.loads(fs.cat_file(path))
    except FileNotFoundError as exc:
        raise StokerError(
            f"the work file {work_url} is gone (a `--restart` removes it)",
            fix=f"submit again ({again})",
        ) from exc
    groups: list[list[int]] = work["groups"]
    if not 0 <= task < len(groups):
        raise StokerError(f"task {task} is not one of the {len(groups)} in {work_url}")
    return work, groups[task]
