"""One array task of `stoker data pack --slurm`: `python -m stoker.data.jobs.pack_task DST
--work WORK_URL --task I`.

The work file (written by the submitting command under DST/pack-work/) lists each
task's shards and SRC's URL; the plan is DST/pack-plan.json. Task I writes those of
its shards not finished yet (a requeued task skips what it did), then writes DST's
manifest if every shard is there: whichever task ends last completes the data set.
A stop request (the stop file, SIGUSR2 or SIGTERM: time limit, preemption, requeue)
is taken between shards: the task exits EXIT_REQUEUE so that the batch script
requeues it. A shard that cannot be written does not stop the others; the task then
exits 1 naming each, and a re-run of the pack writes them.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

from stoker.data.jobs.array_task import read_work, task_main
from stoker.data.pack.plan import PLAN_NAME, load_plan
from stoker.data.write.location import open_location
from stoker.data.write.shard_set import finished_shards, shard_path
from stoker.errors import StokerError
from stoker.plural import plural
from stoker.protocol import EXIT_REQUEUE


def run_task(dst: str, work_url: str, task: int, stop: Callable[[], bool]) -> int:
    """Write task `task`'s unfinished shards, then the manifest if every shard is there;
    0, or EXIT_REQUEUE when `stop()` asked to stop between shards."""
    from stoker.data.pack.pipeline import finalize_pack, plan_digest, shard_task
    from stoker.data.pack.shard import write_planned_shard

    fs, root, dst_url = open_location(dst)
    plan = load_plan(fs, root)
    if plan is None:
        raise StokerError(f"{dst} holds no {PLAN_NAME}", fix="submit the pack again")
    work, mine = read_work(work_url, task, "`stoker data pack SRC DST --slurm`")
    if work.get("plan_sha256") != plan_digest(plan):
        raise StokerError(
            f"{dst} was planned again since this job was submitted: its {PLAN_NAME} is not "
            f"the one {work_url} was made from",
            fix="submit the pack again (`stoker data pack SRC DST --slurm`)",
        )
    done = finished_shards(fs, root, mine)
    print(f"stoker: pack task {task}: shards {mine} ({len(done)} already written)", flush=True)
    failures: dict[int, str] = {}
    for number in mine:
        if number in done:
            continue
        if stop():
            print(f"stoker: stop requested before shard {number}: exit {EXIT_REQUEUE}", flush=True)
            return EXIT_REQUEUE
        began = time.monotonic()
        print(f"stoker: writing shard {number}", flush=True)
        try:
            result = write_planned_shard(shard_task(plan, work["src_url"], dst_url, number))
        except Exception as exc:  # reported with the shard; the others go on
            traceback.print_exc()
            failures[number] = f"{type(exc).__name__}: {exc}"
            continue
        print(
            f"stoker: shard {number}: {plural(result.samples, 'sample')}, "
            f"{plural(len(result.skipped), 'input')} skipped, {result.bytes / 1e6:.1f} MB in "
            f"{time.monotonic() - began:.1f} s",
            flush=True,
        )
    if failures:
        lines = "\n".join(f"  {shard_path(n)}: {why}" for n, why in sorted(failures.items()))
        raise StokerError(
            f"task {task}: {plural(len(failures), 'shard')} of {len(mine)} "
            f"{'was' if len(failures) == 1 else 'were'} not written:\n{lines}",
            fix="fix the cause above and run the same `stoker data pack` again: it keeps "
            "the finished shards and writes the rest",
        )
    if finalize_pack(dst) is not None:
        print(f"stoker: every shard is written: wrote {dst_url}/manifest.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(task_main("python -m stoker.data.jobs.pack_task", run_task))
