"""One rank of the flight-recorder test: `python flight_worker.py RANK PORT RUN_DIR`.
Both ranks all-reduce three times over gloo; rank 0 then starts an all-gather that
rank 1 never joins (async, so it returns), and each rank dumps its flight recorder
into the run folder as a failing job's would."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from stoker.runtime.dist import flight_recorder


def main() -> None:
    rank, port, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ.update({"STOKER_RUN_DIR": run_dir, "STOKER_RESTART": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})  # fmt: skip
    flight_recorder.configure(os.environ, cuda=False)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    tensor = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(tensor)
    if rank == 0:
        dist.all_gather_into_tensor(torch.empty(8), torch.ones(4), async_op=True)
    assert flight_recorder.dump(rank) is not None
    os._exit(0)  # the all-gather never completes: no orderly teardown


if __name__ == "__main__":
    main()
