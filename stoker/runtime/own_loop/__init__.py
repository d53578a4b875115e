"""Your own training loop with stoker's guarantees: what `stoker.job` (the public
module, stoker/job.py) is made of.

`init()` (run.py) does for a user's script what stoker/runtime/train.py does for the built-in
trainer, from the same variables and frozen config the launcher gives every task:

    the process group    rendezvous.join: every rank joined or a named failure; the
                         device mesh (FSDP on a node, HSDP across nodes)
    stop requests        SIGUSR2, SIGTERM and the stop file (stop_request.py), agreed
                         by all ranks in `should_stop()`, the loop's one collective
    the hang watchdog    a heartbeat per rank (heartbeat.py), beating in should_stop()
    stragglers           each rank's own time between two should_stop() calls (and
                         its data wait, with `run.loader()`), gathered there
    MLflow               rank 0 logs into the job's run (rank_tracking.py): spooled
                         through outages, each step once across requeues; the data
                         sets the run reads as its dataset inputs (data_lineage.py)
    progress             rank 0's progress.json for `stoker status` (step, loss, ETA)
    exit codes           75 requeue, 143 terminated, 76 a lost peer, 124 a hang, 1 an
                         error: the batch script reads them as it reads the trainer's

and `Checkpoint` (checkpoint.py) is the trainer's verified async checkpointer; `JobLoader`
(loader.py) the built-in trainer's loader, its batches on the run's device as the
trainer's are. The lifecycle under them is the trainer's: stoker/runtime/session.py.
"""

from stoker.runtime.own_loop.checkpoint import Checkpoint
from stoker.runtime.own_loop.loader import JobLoader
from stoker.runtime.own_loop.run import Run, init

__all__ = ["Checkpoint", "JobLoader", "Run", "init"]
