"""One array task of `stoker data encode --slurm`: `python -m stoker.data.encode_task
DST --work WORK_URL --task I`.

The work file (written by the submitting command) lists each task's shards; task I
encodes those of its group not finished yet (a requeued task skips what it did), then
writes DST's manifest if every shard is there: whichever task ends last completes the
data set. A stop request (the stop file, SIGUSR2 or SIGTERM: time limit, preemption,
requeue) is taken between batches: the shard being built is dropped, and the task
exits EXIT_REQUEUE so that the batch script requeues it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from stoker.data.latent_plan import load_plan, shard_task
from stoker.data.pack_plan import open_location
from stoker.data.shard_set import finished_shards
from stoker.errors import StokerError
from stoker.protocol import ENV_STOP_FILE, EXIT_REQUEUE


class _Stop:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoker.data.encode_task")
    parser.add_argument("dst")
    parser.add_argument("--work", required=True, help="the work file: each task's shards")
    parser.add_argument("--task", type=int, required=True)
    ns = parser.parse_args(argv)
    stop = _Stop()
    try:
        return run_task(ns.dst, ns.work, ns.task, stop)
    except StokerError as exc:
        print(f"stoker: error: {exc.message}", file=sys.stderr)
        if exc.fix:
            print(f"stoker: fix: {exc.fix}", file=sys.stderr)
        return 1


def run_task(dst: str, work_url: str, task: int, stop: _Stop) -> int:
    from stoker.data.encode_shard import encode_shard
    from stoker.data.latent_encode import finalize

    fs, root, dst_url = open_location(dst)
    plan = load_plan(fs, root)
    if plan is None:
        raise StokerError(f"{dst} holds no encode plan", fix="submit the encode again")
    work_fs, work_path, _ = open_location(work_url)
    work = json.loads(work_fs.cat_file(work_path))
    groups: list[list[int]] = work["groups"]
    if not 0 <= task < len(groups):
        raise StokerError(f"task {task} is not one of the {len(groups)} in {work_url}")
    mine = groups[task]
    done = finished_shards(fs, root, mine)
    print(f"stoker: encode task {task}: shards {mine} ({len(done)} already encoded)", flush=True)
    for number in mine:
        if number in done:
            continue
        if stop():
            print(f"stoker: stop requested before shard {number}: exit {EXIT_REQUEUE}", flush=True)
            return EXIT_REQUEUE
        began = time.monotonic()
        print(f"stoker: encoding shard {number}", flush=True)
        shard = shard_task(
            plan,
            dst_url,
            number,
            batch_size=int(work.get("batch_size", 8)),
            device=work.get("device"),
        )
        try:
            result = encode_shard(shard, stop)
        except InterruptedError:
            print(f"stoker: stop requested in shard {number}: exit {EXIT_REQUEUE}", flush=True)
            return EXIT_REQUEUE
        seconds = time.monotonic() - began
        print(
            f"stoker: shard {number}: {result.samples} samples, {len(result.skipped)} skipped, "
            f"{seconds:.1f} s ({result.samples / max(seconds, 1e-9):.2f} clips/s)",
            flush=True,
        )
    if finalize(dst) is not None:
        print(f"stoker: every shard is encoded: wrote {dst_url}/manifest.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
