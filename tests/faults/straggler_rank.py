"""A training rank with a straggler, for the straggler tests. Started by the
launcher (`stoker submit --local ... -- python tests/faults/straggler_rank.py
SLOW_RANK SLEEP_S WINDOW`) in every task: the real runtime entry point, except
that every rank without a SLURM node calls its node `node-<rank>` and rank
SLOW_RANK sleeps SLEEP_S per step after the first WINDOW steps (the start-up's):
in its data iterator for the next WINDOW steps (a slow loader), inside the
forward of its first block after them (a slow GPU or node)."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from stoker.runtime import train
from stoker.runtime.trainer import Trainer


def main() -> int:
    slow_rank, sleep_s, window = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    # Under `--local` every rank is on this machine: give each a node of its own.
    os.environ.setdefault("SLURMD_NODENAME", f"node-{os.environ['RANK']}")
    batches, build = Trainer._batches, Trainer.build

    def slow_loader(self: Trainer) -> Iterator[dict[str, Any]]:
        for index, batch in enumerate(batches(self)):  # grad_accum 1: batch i is step i + 1
            if self.env.rank == slow_rank and window <= index < 2 * window:
                time.sleep(sleep_s)
            yield batch

    def build_slow_forward(self: Trainer) -> None:
        build(self)
        if self.env.rank != slow_rank:
            return
        first = self.model.blocks[0]  # sharded, hooked: the sleep runs inside its forward
        forward, calls = first.forward, itertools.count(1)

        def slow_forward(*args: Any, **kwargs: Any) -> Any:
            if next(calls) > 2 * window:
                time.sleep(sleep_s)
            return forward(*args, **kwargs)

        first.forward = slow_forward

    Trainer._batches = slow_loader  # type: ignore[method-assign]
    Trainer.build = build_slow_forward  # type: ignore[method-assign]
    return train.main(["--config", os.environ["STOKER_CONFIG"]])


if __name__ == "__main__":
    sys.exit(main())
