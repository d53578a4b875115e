"""A training rank whose data stalls, for the hang watchdog's tests. Started by
the launcher (`stoker submit --local ... -- python tests/faults/hang_rank.py
STALL_RANK STALL_STEP [ATTEMPT]`) in every task: the real runtime entry point,
except that rank STALL_RANK stops getting batches before step STALL_STEP, inside
`stall_in_data` (the name the test looks for in its dumped stack); with ATTEMPT,
only in that attempt of the job ($STOKER_RESTART)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

from stoker.runtime import train
from stoker.runtime.trainer import Trainer


def stall_in_data() -> None:
    time.sleep(3600)  # storage that stopped answering


def main() -> int:
    import os

    stall_rank, stall_step = int(sys.argv[1]), int(sys.argv[2])
    attempt = os.environ.get("STOKER_RESTART", "0")
    stalls = len(sys.argv) < 4 or sys.argv[3] == attempt
    batches = Trainer._batches

    def stalling(self: Trainer) -> Iterator[dict[str, Any]]:
        for index, batch in enumerate(batches(self)):
            if stalls and self.env.rank == stall_rank and index + 1 == stall_step:
                stall_in_data()
            yield batch

    Trainer._batches = stalling  # type: ignore[method-assign]
    return train.main(["--config", os.environ["STOKER_CONFIG"]])


if __name__ == "__main__":
    sys.exit(main())
