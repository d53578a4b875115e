"""Several pytest processes share one run of the suite, a module at a time.

With STOKER_TEST_QUEUE=DIR, every process that is given the same DIR and the same
arguments collects the same tests, then claims whole modules from one list (a file
created in DIR with O_EXCL: exactly one process wins each) and runs only those it
claimed. A module stays in one process, so its module fixtures (a shared run, a
server) are built once, as in a single process. The modules known to take longest
start first (LONGEST_FIRST), so that none of them is left to run alone at the end;
the rest follow in collection order.

scripts/test-suite starts two such processes for the modules off the cluster, beside
the cluster tests: they fill the time those spend waiting on SLURM, and the suite's
tail runs on both cores.
Each process reports its own tests; a test runs in exactly one of them. Every process
ends only when no module is left unclaimed, so the run as a whole is complete when
each process has exited 0 (or 5: it was left no module).

Without STOKER_TEST_QUEUE the plugin does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

QUEUE_ENV = "STOKER_TEST_QUEUE"

# Modules off the cluster by wall time in `make test` (tests/cost_report.py, the run of
# 2026-11-28; test_docs.py and test_plan_cli.py, off the cluster since 2026-11-29, and the
# docs' tours by the cluster process's figures of that day), longest first. A module
# missing here just starts later; refresh the list from the report's per-test rows when a
# module grows past a minute.
LONGEST_FIRST = (
    "tests/runtime/test_run_cli.py",
    "tests/checkpoint/test_resume.py",
    "tests/test_docs.py",
    "tests/benchmarks/test_plan_benchmark.py",
    "tests/plan/test_plan_cli.py",
    "tests/runtime/test_plugin_model.py",
    "tests/tracking/test_outage.py",
    "tests/test_docs_tours.py",
    "tests/plan/test_plan_memory.py",
    "tests/runtime/own_loop/test_own_loop.py",
    "tests/benchmarks/test_gpu_check.py",
    "tests/runtime/dist/test_rendezvous.py",
    "tests/runtime/test_checkpoint_records.py",
    "tests/kernels/test_compile.py",
    "tests/faults/test_hostile_input.py",
    "tests/tracking/test_mlflow_ui.py",
    "tests/tracking/test_run_logger.py",
    "tests/tracking/test_mlflow_ui_datasets.py",
    "tests/launcher/test_sweep_model_args.py",
    "tests/runtime/test_latent_training.py",
    "tests/runtime/test_bench_step.py",
)


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def modules_in_order(items: list[pytest.Item]) -> list[tuple[str, list[pytest.Item]]]:
    """The collected tests grouped by module: LONGEST_FIRST's modules first, in its
    order, then the others in collection order; within a module, collection order."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(module_of(item), []).append(item)
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    order = sorted(groups, key=lambda m: (rank.get(m, len(rank)), list(groups).index(m)))
    return [(module, groups[module]) for module in order]


class ModuleQueue:
    def __init__(self, folder: Path, label: str) -> None:
        self.folder = folder
        self.label = label
        self.ran: list[str] = []

    def check_same_collection(self, modules: list[tuple[str, list[pytest.Item]]]) -> None:
        """The first process writes what it collected; a process that collected
        something else would leave tests unrun or run them twice, so it stops."""
        listing = "".join(f"{m}\t{len(items)}\n" for m, items in modules)
        mine = self.folder / f"collected-by-{self.label}-{os.getpid()}.txt"
        first = self.folder / "collected.txt"
        mine.write_text(listing)
        try:
            # A hard link appears with its content: a process that loses the race never
            # reads a first listing not yet written.
            os.link(mine, first)
        except FileExistsError:
            if first.read_text() != listing:
                raise pytest.UsageError(
                    f"{QUEUE_ENV}={self.folder}: this process collected other tests than the "
                    f"first process that shares the folder (its modules: {mine}; the first's: "
                    f"{first}); give every process the same arguments, or each its own folder"
                ) from None

    def claim(self, module: str) -> bool:
        claim = self.folder / ("claimed-" + module.replace("/", "__"))
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(f"{self.label} {os.getpid()}\n")
        self.ran.append(module)
        return True

    def claimed(self, modules: list[tuple[str, list[pytest.Item]]]) -> Iterator[list[pytest.Item]]:
        for module, items in modules:
            if self.claim(module):
                yield items


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.pop(QUEUE_ENV, None)  # a pytest the tests start does not join
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        label = os.environ.get("STOKER_TEST_COST_LABEL", str(os.getpid()))
        config.stash[_QUEUE] = ModuleQueue(Path(folder), label)


_QUEUE = pytest.StashKey[ModuleQueue]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    queue = session.config.stash.get(_QUEUE, None)
    if queue is None or session.config.option.collectonly:
        return None  # pytest's own loop
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    modules = modules_in_order(session.items)
    queue.check_same_collection(modules)
    claimed = queue.claimed(modules)
    current = next(claimed, None)
    while current is not None:
        following = None
        for i, item in enumerate(current):
            if i + 1 < len(current):
                nextitem: pytest.Item | None = current[i + 1]
            else:
                # Claimed before the module's last test runs: pytest tears down what the
                # next test does not share (module fixtures; session ones only at the end).
                following = next(claimed, None)
                nextitem = following[0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    return True


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    queue = config.stash.get(_QUEUE, None)
    if queue is not None:
        terminalreporter.write_line(
            f"module queue {queue.folder}: this process ({queue.label}) ran {len(queue.ran)} "
            "modules; the processes sharing the folder ran the others (progress percentages "
            "count every collected test)"
        )
