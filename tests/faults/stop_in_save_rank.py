"""A training rank that freezes (SIGSTOP, as a hung process) inside the write of a
checkpoint: `python tests/faults/stop_in_save_rank.py STOP_RANK STEP` in every task,
the real runtime entry point otherwise (`stoker.runtime.train.run`, which ends the
process as `python -m stoker.runtime.train` does). Rank STOP_RANK stops itself in the
write of step-STEP, while the other ranks' saves of it wait for it in a collective."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from stoker.checkpoint import checkpointer
from stoker.runtime import train


def main() -> None:
    stop_rank, step = int(sys.argv[1]), int(sys.argv[2])
    if int(os.environ.get("RANK", "0")) == stop_rank:
        make_writer = checkpointer.storage_writer

        def storage_writer(url: str, fs_options: dict[str, Any] | None = None) -> Any:
            writer = make_writer(url, fs_options)
            if url.rstrip("/").endswith(f"step-{step}"):
                write_data = writer.write_data

                def stopped(plan: Any, planner: Any) -> Any:
                    os.kill(os.getpid(), signal.SIGSTOP)
                    return write_data(plan, planner)

                writer.write_data = stopped
            return writer

        checkpointer.storage_writer = storage_writer  # type: ignore[assignment]
    train.run(["--config", os.environ["STOKER_CONFIG"]])


if __name__ == "__main__":
    main()
