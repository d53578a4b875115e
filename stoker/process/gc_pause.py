"""Python's cyclic garbage collector paused while a process imports and sets up, then
resumed with what the set-up made frozen.

Importing torch, its distributed stack, mlflow and the runtime makes about a million
objects that live as long as the process. Each burst of allocations runs the
collector, and its oldest generation walks all of them, again and again: on the 2-core
VM a training rank's start, from its first import to its tracking store, cost 30% less
CPU with the collector paused (rank 0 of a 2-step `stoker run` 6.9-8.1 -> 4.7-5.7
CPU-s, rank 1 4.5-5.6 -> 3.2-3.6; 2026-12-03). `gc.freeze()` then moves what the
set-up made to the permanent generation: the collections while training walk only what
training makes, and a fork server's children share those pages without touching them
(CPython's advice for processes that fork workers).

Paused only where no tensor memory is let go: imports, opening the tracking store,
joining the process group. Never across a model build or a checkpoint load, where a
cycle holding a GPU tensor would keep its memory until the collector ran again.

A process that exits through the interpreter's finalization unfreezes first (atexit):
frozen objects are never collected there, and extensions that count their objects at
exit would report them as leaks (triton's nanobind lists every one).
"""

from __future__ import annotations

import atexit
import gc

_unfreeze_at_exit: list[bool] = []
_enabled_at_pause: list[bool] = []


def pause_collector() -> None:
    """No cyclic collection until `resume_collector()` (reference counting still frees
    everything outside a cycle). Pauses nest."""
    _enabled_at_pause.append(gc.isenabled())
    gc.disable()


def resume_collector(*, freeze: bool = True) -> None:
    """The collector as it was at the matching pause (on, unless its caller had turned it
    off); with `freeze`, first freeze every object alive now (never collected, never
    walked again). Without it where those objects are not only ours (a loop of one's own
    imports `stoker.job` and calls `init()` holding its own)."""
    if freeze:
        gc.freeze()
        if not _unfreeze_at_exit:
            atexit.register(gc.unfreeze)
            _unfreeze_at_exit.append(True)
    if not _enabled_at_pause or _enabled_at_pause.pop():
        gc.enable()
