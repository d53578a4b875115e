"""A training rank with injected trouble, for the insights mix on the real cluster.
Started by the launcher in every task (`stoker submit ... -- python mix_rank.py JSON`):
the real runtime entry point, except that its data iterator does what JSON asks:

    {"data_stall": [STEP, SECONDS]}        every rank waits SECONDS for the batch of STEP
    {"slow": [RANK, SECONDS, FROM, TO]}    RANK waits SECONDS for each batch of steps
                                           FROM..TO-1 (a straggling node)
    {"hang": [RANK, STEP]}                 RANK never gets the batch of STEP
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from stoker.runtime import train
from stoker.runtime.trainer import Trainer


def main() -> int:
    plan: dict[str, Any] = json.loads(sys.argv[1])
    batches = Trainer._batches

    def injected(self: Trainer) -> Iterator[Any]:
        rank = self.env.rank
        for index, batch in enumerate(batches(self)):
            step = self.start_step + index + 1  # grad_accum 1: one batch a step
            if "data_stall" in plan and step == plan["data_stall"][0]:
                time.sleep(plan["data_stall"][1])
            if "slow" in plan:
                slow_rank, seconds, first, stop = plan["slow"]
                if rank == slow_rank and first <= step < stop:
                    time.sleep(seconds)
            if "hang" in plan and (rank, step) == tuple(plan["hang"]):
                time.sleep(3600)
            yield batch

    Trainer._batches = injected  # type: ignore[method-assign]
    return train.main(["--config", os.environ["STOKER_CONFIG"]])


if __name__ == "__main__":
    sys.exit(main())
