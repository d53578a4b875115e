"""Imported by multiprocessing's fork server only, as its last preload module
(stoker/data/stream/loader.py): the first, fork_server_guard.py, paused the cyclic
garbage collector while torch, numpy and av import; this turns it back on with what they
made frozen. The workers forked from here share those objects' pages and their
collections never walk them (stoker/process/gc_pause.py).
"""

from __future__ import annotations

from stoker.process.gc_pause import resume_collector

resume_collector()
