"""Imported by multiprocessing's fork server only, as its first preload module
(stoker/data/stream/loader.py): the fork server ends when the rank that started it ends
(stoker/data/stream/parent_death.py). Its import is the effect: the fork server's preload
list is the one hook that runs code in it before it forks a worker.
"""

from __future__ import annotations

from stoker.data.stream.parent_death import die_with_parent

die_with_parent()
