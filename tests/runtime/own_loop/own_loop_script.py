"""A small loop of one's own on `stoker.job`, for tests/runtime/own_loop/test_own_loop.py:
`python own_loop_script.py MODE[,MODE] [RANK]`, started by `stoker run -- ...` on every
rank (modes joined by commas act together: `slow,nofinish`).

    ok       trains train.steps steps of a linear model on stoker's loader
    slow R   rank R takes 0.3 s more per step (a straggler)
    raise    rank 1 raises ValueError at step 3
    hang R   rank R stops calling should_stop() at step 3 (sleeps)
    nofinish trains, but the script ends without run.finish()
    cp       with train.context_parallel=2: logs `cp_one_batch`, 1 when both ranks (one
             CP group) got the same batch and their own halves of a sequence, else 0
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from stoker import job
from stoker.model import token_slice

modes = set(sys.argv[1].split(","))
target = int(sys.argv[2]) if len(sys.argv) > 2 else 1

run = job.init()
model = nn.Linear(1, 1).to(run.device)
optim = torch.optim.SGD(model.parameters(), lr=0.1)
loader = run.loader()
ckpt = run.checkpointer(model=model, optim=optim, loader=loader)
start = ckpt.restore()
batches = loader.batches()
total = run.config.train.steps
for step in range(start, total):
    batch = next(batches)
    x = batch["audio"].float().mean(dim=(1, 2)).unsqueeze(1)
    loss = (model(x) - 0.5).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    done = step + 1
    if "slow" in modes and run.rank == target:
        time.sleep(0.3)
    if "raise" in modes and run.rank == target and done == 3:
        raise ValueError("the loss went sideways at step 3")
    if "hang" in modes and run.rank == target and done == 3:
        time.sleep(3600)
    logged = {"loss": loss.item(), "x_mean": x.mean().item()}
    if "cp" in modes:
        assert run.cp is not None and run.cp.size == 2, run.cp
        both = run.cp.gather(batch["position"], dim=0)  # rank 0's positions, then rank 1's
        half = token_slice(4) == slice(2 * run.cp.rank, 2 * run.cp.rank + 2)
        same = torch.equal(both[: len(both) // 2], both[len(both) // 2 :])
        logged["cp_one_batch"] = float(same and half)
    run.log(logged, step=done)
    if run.should_stop():
        ckpt.save(done, wait=True)
        run.exit_for_requeue()
ckpt.save(total, wait=True)
if "nofinish" not in modes:
    run.finish()
