"""A job for launcher tests: every rank joins a gloo process group via the launcher's
MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE and all-reduces its rank; all must agree. It
prints its CPU seconds so far (`cpu=`), which its job's CPU account must include, and
its arguments (`argv=`), which must be the command's as the user typed them."""

import os
import resource
import socket
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
value = torch.tensor([float(rank)])
dist.all_reduce(value)
expected = world * (world - 1) / 2
print(
    f"rank={rank} local_rank={os.environ['LOCAL_RANK']} world={world} "
    f"host={socket.gethostname()} node={os.environ.get('SLURMD_NODENAME', 'local')} "
    f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} sum={value.item():g} "
    f"ok={value.item() == expected} "
    f"cpu={sum(resource.getrusage(resource.RUSAGE_SELF)[:2]):.3f} argv={sys.argv[1:]}",
    flush=True,
)
dist.destroy_process_group()
