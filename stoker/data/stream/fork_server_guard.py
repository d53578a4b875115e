"""Imported by multiprocessing's fork server only, as its first preload module
(stoker/data/stream/loader.py): the fork server ends when the rank that started it ends
(stoker/data/stream/parent_death.py), and blocks the stop signals for the workers it
forks. Its import is the effect: the fork server's preload list is the one hook that
runs code in it before it forks a worker.
"""

from __future__ import annotations

import signal

from stoker.data.stream.parent_death import STOP_SIGNALS, die_with_parent
from stoker.process.gc_pause import pause_collector

die_with_parent()
# The workers forked from here start with the stop signals blocked (a fork keeps the
# mask): torch installs a SIGTERM handler in each before the loader's worker_init_fn
# ignores them, and a SIGTERM delivered in between would kill the worker. Blocked, it
# waits and is discarded when the worker ignores it (stoker/data/stream/loader.py).
signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
# The collector paused while the other preload modules import; the last of them,
# fork_server_ready.py, resumes it (stoker/process/gc_pause.py).
pause_collector()
