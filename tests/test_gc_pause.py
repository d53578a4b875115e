"""stoker/process/gc_pause.py: the collector paused while a process imports, resumed with
what the imports made frozen, and unfrozen before the interpreter's own exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.process.gc_pause import pause_collector, resume_collector

# A cycle made while paused stays until resumed; the objects alive at resume are frozen;
# an extension that counts its live objects at exit (triton's nanobind) is shown none.
PAUSED_THEN_RESUMED = """
import atexit, gc, weakref
from stoker.process.gc_pause import pause_collector, resume_collector

# Registered first, so run last (atexit runs the last registered first): after the
# unfreeze that resume_collector registers.
atexit.register(lambda: print("unfrozen at exit:", gc.get_freeze_count() == 0, flush=True))

class Node:
    pass

pause_collector()
node = Node(); node.me = node; cycle = weakref.ref(node); del node
for _ in range(100_000):  # allocations enough to run a collection many times over
    [[], []]
print("paused, the cycle kept:", not gc.isenabled(), cycle() is not None)
kept = [Node() for _ in range(1000)]
resume_collector()
print("resumed:", gc.isenabled(), "frozen:", gc.get_freeze_count() >= 1000)
"""


def test_paused_then_resumed_with_what_was_alive_frozen_and_unfrozen_at_exit() -> None:
    result = subprocess.run([sys.executable, "-c", PAUSED_THEN_RESUMED], capture_output=True,
                            text=True, timeout=60, check=True)  # fmt: skip
    assert result.stdout.splitlines() == [
        "paused, the cycle kept: True True",
        "resumed: True frozen: True",
        "unfrozen at exit: True",
    ], result.stdout


@pytest.mark.parametrize(
    ("entry", "argv"),
    [
        ("stoker.runtime.train", ["--config", "/nonexistent/config.yaml"]),
        ("stoker.runtime.preflight", ["--config", "/nonexistent/config.yaml"]),
    ],
)
def test_an_entry_point_that_fails_at_start_leaves_the_collector_on(
    entry: str, argv: list[str], tmp_path: Path
) -> None:
    """Called in-process (as tests and wrappers like tests/faults/hang_rank.py do), a
    start that raises leaves its caller's collector as it found it: on."""
    import gc
    import importlib

    main = importlib.import_module(entry).main
    assert gc.isenabled()
    with pytest.raises(Exception):  # noqa: B017  (any failure of the missing file)
        main(argv)
    assert gc.isenabled()


def test_the_suites_collection_ran_with_the_collector_paused_and_left_it_on() -> None:
    import gc

    # tests/conftest.py: paused from its import to the end of collection, then resumed.
    assert gc.isenabled() and gc.get_freeze_count() > 100_000
    pause_collector()
    assert not gc.isenabled()
    resume_collector()
    assert gc.isenabled()


def test_a_pause_gives_back_the_collector_as_it_found_it() -> None:
    """Pauses nest, and a caller that had turned the collector off keeps it off (a loop
    of one's own imports stoker.job, which pauses while the runtime imports)."""
    import gc

    pause_collector()
    pause_collector()
    resume_collector(freeze=False)
    assert not gc.isenabled()  # the outer pause still holds
    resume_collector(freeze=False)
    assert gc.isenabled()
    gc.disable()
    try:
        pause_collector()
        resume_collector(freeze=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
