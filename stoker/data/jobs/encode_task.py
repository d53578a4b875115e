"""One array task of `stoker data encode --slurm`: `python -m stoker.data.jobs.encode_task
DST --work WORK_URL --task I`.

The work file (written by the submitting command) lists each task's shards; task I
encodes those of its group not finished yet (a requeued task skips what it did), then
writes DST's manifest if every shard is there: whichever task ends last completes the
data set. A stop request (the stop file, SIGUSR2 or SIGTERM: time limit, preemption,
requeue) is taken between batches: the shard being built is dropped, and the task
exits EXIT_REQUEUE so that the batch script requeues it.
"""

from __future__ import annotations

import sys
import time

from stoker.data.encode.plan import load_plan, shard_task
from stoker.data.jobs.array_task import Stop, read_work, task_main
from stoker.data.write.location import open_location
from stoker.data.write.shard_set import finished_shards
from stoker.errors import StokerError
from stoker.plural import plural
from stoker.protocol import EXIT_REQUEUE


def run_task(dst: str, work_url: str, task: int, stop: Stop) -> int:
    from stoker.data.encode.pipeline import finalize
    from stoker.data.encode.shard import encode_shard

    fs, root, dst_url = open_location(dst)
    plan = load_plan(fs, root)
    if plan is None:
        raise StokerError(f"{dst} holds no encode plan", fix="submit the encode again")
    work, mine = read_work(work_url, task, "`stoker data encode SRC DST --slurm`")
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
        gpu = result.gpu_util
        busy = f", GPU {sum(gpu) / len(gpu):.0f}% busy" if gpu else ""
        print(
            f"stoker: shard {number}: {plural(result.samples, 'sample')}, "
            f"{len(result.skipped)} skipped, "
            f"{seconds:.1f} s ({result.samples / max(seconds, 1e-9):.2f} clips/s, encoder "
            f"{result.encode_s / max(seconds, 1e-9):.0%} of it{busy})",
            flush=True,
        )
    if finalize(dst) is not None:
        print(f"stoker: every shard is encoded: wrote {dst_url}/manifest.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(task_main("python -m stoker.data.jobs.encode_task", run_task))
