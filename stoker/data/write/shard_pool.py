"""Write shards in local processes (`data pack`, `data encode` without --slurm): each
shard's writer runs alone, a failure is reported with its shard and the others go on.

Workers are 'forkserver' (or 'spawn') processes, never forked copies of this one:
fsspec's async filesystems (s3fs, gcsfs) are not fork-safe.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from stoker.plural import plural
from stoker.process.environment import adopt_environment, environment_now

R = TypeVar("R")


class PackProgress(Protocol):
    """Where `run_pack` (and `run_encode`) report how far they are (the CLI draws a bar
    from it)."""

    def start(self, description: str, total: int, completed: int = 0) -> None: ...

    def advance(self, amount: int = 1) -> None: ...

    def note(self, message: str) -> None: ...


class SilentProgress:
    def start(self, description: str, total: int, completed: int = 0) -> None:
        pass

    def advance(self, amount: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        pass


def run_shard_writers(
    write: Callable[[Any], R],
    tasks: Sequence[Any],
    workers: int,
    advance: Callable[[], None],
    *,
    fatal: tuple[type[BaseException], ...] = (),
) -> tuple[dict[int, R], dict[int, str]]:
    """`write(task)` for each task (each with a `number`), here when `workers` <= 1, else
    in that many processes: results and failures ("Type: message") by shard number. An
    exception of a `fatal` type stops everything (the rest would fail the same way)."""
    results: dict[int, R] = {}
    failures: dict[int, str] = {}
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            try:
                results[task.number] = write(task)
            except fatal:
                raise
            except Exception as exc:  # reported with the shard; the others go on
                failures[task.number] = f"{type(exc).__name__}: {exc}"
            advance()
        return results, failures

    from concurrent.futures import ProcessPoolExecutor, as_completed

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    with ProcessPoolExecutor(
        min(workers, len(tasks)),
        mp_context=context,
        initializer=adopt_environment,  # this call's environment, not the fork server's
        initargs=(environment_now(),),
    ) as pool:
        futures = {pool.submit(write, task): task.number for task in tasks}
        for future in as_completed(futures):
            number = futures[future]
            try:
                results[number] = future.result()
            except fatal:
                for other in futures:
                    other.cancel()
                raise
            except Exception as exc:  # a worker that died fails its shards, not the run
                failures[number] = f"{type(exc).__name__}: {exc}"
            advance()
    return results, failures


def refuse_failures(failures: dict[int, str], planned: int, verb: str) -> None:
    """A StokerError listing the shards that failed (`verb`: "written", "encoded"), with
    the fix: the same command again keeps the finished ones; nothing when none failed."""
    if not failures:
        return
    from stoker.data.format.shard_format import MANIFEST_NAME
    from stoker.data.write.shard_set import shard_path
    from stoker.errors import StokerError

    lines = "\n".join(f"  {shard_path(n)}: {why}" for n, why in sorted(failures.items()))
    raise StokerError(
        f"{plural(len(failures), 'shard')} of {planned} "
        f"{'was' if len(failures) == 1 else 'were'} not {verb} (no {MANIFEST_NAME} yet):\n{lines}",
        fix="fix the cause above and run the same command again: it keeps the "
        f"{plural(planned - len(failures), 'finished shard')} and does the rest",
    )
