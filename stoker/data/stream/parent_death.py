"""The processes a rank's loader starts end when their parent ends, even by SIGKILL.

A DataLoader's workers fork from multiprocessing's fork server, which the rank
starts; both ignore SLURM's stop signals (stoker/data/stream/loader.py), and the resource
tracker ignores them by design. When the rank is SIGKILLed (the kernel's OOM killer,
a lost node's step cancelled, `kill -9`), they are re-parented to init and, on a
cluster whose process tracking follows the process tree (proctrack/linuxproc), live
on after the job, holding memory and file handles. Linux's parent-death signal ends
each with its parent: the fork server with the rank, the workers with the fork
server; the resource tracker then reads the end of its pipe and exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
# What SLURM sends every process of a step to stop it: SIGTERM (scancel, requeue,
# preemption) and SIGUSR2 (before the time limit). The rank handles them; the processes
# its loader starts ignore them (stoker/data/stream/loader.py).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent ends. False where
    the system has no parent-death signal (not Linux): nothing is changed then.

    The signal is tied to the thread that started this process: a process started from
    a thread that ends earlier than its process gets it then. The loader starts its fork
    server from the main thread, and the workers come from the fork server's."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:
        # The parent ended before the signal was armed: nobody would send it now.
        os.kill(os.getpid(), sig)
    return True
