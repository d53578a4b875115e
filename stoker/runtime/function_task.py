"""A Python function as a job's task: `python -m stoker.runtime.function_task`.

`stoker.submit(fn, *args)` pickles the call with submitit's own machinery (a
`submitit.helpers.DelayedSubmission`, cloudpickle) into <run>/function/submission.pkl
(stoker/protocol.py). Every task runs it, as submitit's do; global rank 0 writes the
outcome to <run>/function/result.pkl as submitit lays it out, ("success", value) or
("error", the traceback's text), which `Job.result()` reads on the login node. A raised
exception is also printed to the task's log (`stoker logs`, `stoker why`) and the task
exits 1.

On a stop a callable that is a submitit `Checkpointable` is asked for its
`checkpoint(*args, **kwargs)`, the call to make on the next start, which rank 0 pickles
over submission.pkl. Then, after the time limit's USR2 (the batch script's stop file),
the task exits EXIT_REQUEUE and the batch script requeues the job (submitit's own
requeue is its job's, which stoker's batch script replaces); after SIGTERM (`scontrol
requeue`, preemption) it exits as killed by it and SLURM requeues. Any other callable
ends the task as SIGTERM would: the job is not requeued to start it over.

Imports no torch: a function job pays only for what its function imports.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from stoker.atomic_write import write_bytes_atomic
from stoker.protocol import (
    ENV_RUN_DIR,
    ENV_STOP_FILE,
    EXIT_REQUEUE,
    EXIT_TERMINATED,
    FUNCTION_DIR,
    RESULT_FILE,
    SUBMISSION_FILE,
)

STOP_POLL_S = 1.0


def _write_atomic(path: Path, value: Any) -> None:
    """`value` pickled as submitit pickles (cloudpickle), replacing `path` whole: a
    reader on the login node never unpickles half a result."""
    import cloudpickle

    write_bytes_atomic(path, cloudpickle.dumps(value))


class _Stop(BaseException):
    """Raised in the main thread when a stop was requested: not an Exception, so that
    the function's own `except Exception` does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def main() -> int:
    from submitit.helpers import Checkpointable, DelayedSubmission

    folder = Path(os.environ[ENV_RUN_DIR]) / FUNCTION_DIR
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    submission = DelayedSubmission.load(folder / SUBMISSION_FILE)
    stop_file = os.environ.get(ENV_STOP_FILE)

    def on_stop(signum: int, frame: object) -> None:
        raise _Stop(signum)

    # The batch script forwards USR2 (the time limit) and SLURM sends TERM (scancel,
    # requeue, preemption). Tasks start with USR2 ignored, so one sent before this
    # handler existed is lost: the stop file, polled, says it too.
    signal.signal(signal.SIGUSR2, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    if stop_file:
        threading.Thread(target=_watch, args=(Path(stop_file),), daemon=True).start()
    try:
        value = submission.result()
    except _Stop as stop:
        # TERM: SLURM requeues (or ends) the job itself; the exit says killed by it.
        # USR2, the time limit's: the batch script requeues on EXIT_REQUEUE.
        stopped = EXIT_TERMINATED if stop.signum == signal.SIGTERM else EXIT_REQUEUE
        function: Any = submission.function
        if not isinstance(function, Checkpointable):
            print("stoker: stop requested; the function is not a submitit Checkpointable: "
                  "it is not requeued", file=sys.stderr, flush=True)  # fmt: skip
            return EXIT_TERMINATED
        again = function.checkpoint(*submission.args, **submission.kwargs)
        if rank == 0 and again is not None:
            _write_atomic(folder / SUBMISSION_FILE, again)
        print("stoker: stop requested; checkpointed the function's call, exiting to be "
              "requeued", file=sys.stderr, flush=True)  # fmt: skip
        return stopped if again is not None else EXIT_TERMINATED
    except Exception:
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        if rank == 0:
            _write_atomic(folder / RESULT_FILE, ("error", text))
        return 1
    if rank == 0:
        _write_atomic(folder / RESULT_FILE, ("success", value))
    return 0


def _watch(stop_file: Path) -> None:
    """Signal this process once the batch script's stop file exists."""
    while not stop_file.exists():
        time.sleep(STOP_POLL_S)
    os.kill(os.getpid(), signal.SIGUSR2)


if __name__ == "__main__":
    sys.exit(main())
