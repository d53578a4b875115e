"""A resumable job for the preemption/time-limit tests, standing in for the runtime.

Counts steps into STATE (one line per step: the step number, appended and fsynced),
resumes from its last line, and follows the stop protocol: when the stop file exists
or USR2 arrives it finishes the current step, and exits with EXIT_REQUEUE (75).

    python count_steps.py STATE TOTAL_STEPS SECONDS_PER_STEP
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

state, total, pause = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
stop_file = Path(os.environ["STOKER_STOP_FILE"])
progress = os.environ.get("STOKER_PROGRESS_FILE")
rank = int(os.environ.get("RANK", "0"))
stop = False


def on_usr2(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGUSR2, on_usr2)
lines = state.read_text().split() if state.exists() else []
step = int(lines[-1]) if lines else 0
print(f"rank {rank}: restart {os.environ['STOKER_RESTART']} resumes at step {step}", flush=True)
while step < total:
    if stop or stop_file.exists():
        print(f"rank {rank}: stop requested, saved at step {step}", flush=True)
        sys.exit(75)
    time.sleep(pause)
    step += 1
    if rank == 0:
        with open(state, "a") as f:
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        if progress:
            tmp = progress + ".tmp"
            with open(tmp, "w") as f:
                json.dump(
                    {"step": step, "total_steps": total, "loss": 1.0 / step, "time": time.time()}, f
                )
            os.replace(tmp, progress)
print(f"rank {rank}: finished at step {step}", flush=True)
