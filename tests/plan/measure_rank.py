"""One real gloo rank of tests/plan/test_plan_memory.py: for each candidate, the model
built and wrapped as the runtime wraps it, one real step to make AdamW's states, then
one step under PyTorch's FSDP memory tracker. Rank 0 writes the peaks as JSON. The
ranks are alike, so only rank 0's step is tracked; the other takes the same step and
collectives untracked (the tracker's dispatch hook on every op: 73.6 CPU-s for both ranks
tracked, 67.0 so).

Candidates in a row with the same config (the same model, activation checkpointing
and precision; only the micro-batch and accumulation differ) share one model and its
optimizer: the second is measured on the model the first left, whose parameters,
gradients and AdamW states are those of any step after the first. Measured: the same
bytes for each candidate as a model of its own, for half the builds and warm-up steps
(the sweep's gloo part took 66 CPU-s of rank 0, 40 shared)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist


def measure(cfg: Any, shard: int, steps: list[tuple[int, int]]) -> list[int]:
    """The tracked peak of each (micro-batch, accumulation) in `steps`, in order, on one
    model of `cfg`."""
    from torch.distributed.device_mesh import init_device_mesh

    from stoker.model import set_context_parallel
    from stoker.planning.trace import random_batch, train_step
    from stoker.runtime.dist.parallelize import apply_activation_checkpointing, apply_fsdp
    from stoker.runtime.models import build_model
    from stoker.runtime.models.context_parallel import context_parallel_of_world
    from stoker.runtime.observe.step_memory import tracked
    from stoker.runtime.optim import build_optimizer

    mesh = init_device_mesh("cpu", (shard,), mesh_dim_names=("shard",))
    if cfg.train.context_parallel > 1:  # the CP group over both ranks, as the runtime's
        cp = context_parallel_of_world(cfg.train.context_parallel, cfg.train.ulysses_degree())
        set_context_parallel(cp)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, cfg.data)
    apply_activation_checkpointing(model, cfg.train.activation_checkpointing)
    apply_fsdp(model, mesh, bf16_params=False, per_block=False)  # as on CPU ranks
    optimizer = build_optimizer(model, cfg.optim, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    peaks = []
    for index, (micro_batch, accum) in enumerate(steps):
        micro = [random_batch(cfg, micro_batch) for _ in range(min(accum, 2))]
        if index == 0:  # AdamW's states
            train_step(model, optimizer, micro, params, cfg.optim.grad_clip, False)
        if dist.get_rank() != 0:  # its collectives only: rank 0's peak is the one kept
            train_step(model, optimizer, micro, params, cfg.optim.grad_clip, False)
            continue
        with tracked(model, optimizer, micro) as peak:
            train_step(model, optimizer, micro, params, cfg.optim.grad_clip, False)
        peaks.append(int(peak()["Total"]))
    set_context_parallel(None)
    return peaks


def main() -> None:
    from stoker.config import resolve_config

    candidates = json.loads(sys.argv[1])
    out_path = sys.argv[2]
    dist.init_process_group("gloo")
    groups: list[tuple[list[str], list[tuple[int, int]]]] = []
    for c in candidates:
        step = (c["micro_batch"], c["grad_accum"])
        if groups and groups[-1][0] == c["overrides"]:
            groups[-1][1].append(step)
        else:
            groups.append((c["overrides"], [step]))
    results = []
    for overrides, steps in groups:
        cfg = resolve_config(None, overrides, use_profile=False).config
        results += measure(cfg, dist.get_world_size(), steps)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
