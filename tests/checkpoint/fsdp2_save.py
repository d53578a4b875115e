"""A sharded checkpoint as the runtime writes one, for tests/checkpoint/test_export.py.

Run on CPU ranks (gloo) by torchrun or tests/local_ranks.py (torchrun's variables):

    python tests/local_ranks.py --nproc-per-node 2 --master-port P \\
        tests/checkpoint/fsdp2_save.py ROOT STEP REFERENCE

Builds the tiny av_dit of stoker/runtime/tiny.yaml with random values in every
weight, shards it with FSDP2 as the runtime does on GPUs (apply_fsdp, a unit per
block; CPU ranks make the model one unit, which shards each parameter alike), takes one AdamW
step on a different batch per rank (and one of an EMA of decay 0.5), saves
{"model", "optim", "train", "rng": {"rank-<r>"}, "ema"} with DCP into
ROOT/step-STEP as stoker.checkpoint.train_state lays it out, and commits it on
rank 0 with the frozen experiment beside it (config.yaml: tiny.yaml in fp32, which
`stoker sample` reads when given no run folder), as the runtime's checkpointer commits.
Rank 0 also writes REFERENCE (torch.save): the full state dict, the full
EMA, a fixed input, and the sharded model's outputs on it.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from stoker.checkpoint.commit import CONFIG_NAME, write_commit
from stoker.config import DataConfig, resolve_config
from stoker.config.frozen import frozen_text
from stoker.runtime.dist import dist_env, rendezvous
from stoker.runtime.dist.parallelize import apply_fsdp
from stoker.runtime.ema import EMA
from stoker.runtime.models import AVDiT, build_model, clip_frames, clip_samples
from stoker.runtime.optim import build_optimizer

TINY = Path(str(resources.files("stoker.runtime") / "tiny.yaml"))


def batch_of(data: DataConfig, size: int, seed: int) -> dict[str, torch.Tensor]:
    """Random clips in the loader's dtypes and shapes."""
    gen = torch.Generator().manual_seed(seed)
    video = (size, clip_frames(data), 3, *data.resolution)
    return {
        "video": torch.randint(0, 256, video, generator=gen, dtype=torch.uint8),
        "audio": torch.rand((size, data.channels, clip_samples(data)), generator=gen) * 2 - 1,
    }


def main(root: Path, step: int, reference: Path) -> None:
    torch.set_num_threads(1)
    env = dist_env.detect()
    device = torch.device("cpu")
    rendezvous.join(env, device, rendezvous_timeout_s=300, collective_timeout_s=300)
    mesh = dist_env.data_parallel_mesh(env, device)
    assert mesh is not None and env.world_size == 2, "run with 2 ranks"
    cfg = resolve_config(TINY, use_profile=False).config

    torch.manual_seed(cfg.train.seed)  # every rank initialises the same weights
    model = build_model(cfg.model, cfg.data)
    assert isinstance(model, AVDiT)
    # Random values everywhere, adaLN-zero's zeros included: the output then
    # depends on every parameter, and a step changes every one.
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape) * 0.1 + (param.dim() == 1))
    apply_fsdp(model, mesh, bf16_params=False)
    assert isinstance(model, FSDPModule)
    optimizer = build_optimizer(model, cfg.optim, device)
    ema = EMA(model, 0.5)
    loss = model.loss(batch_of(cfg.data, 2, seed=100 + env.rank), torch.Generator().manual_seed(1))
    loss.backward()
    optimizer.step()
    ema.update()
    optimizer.zero_grad()

    # The trained, still sharded model on a fixed input: every rank runs the
    # same forward (a collective); rank 0 keeps the result.
    fixed = batch_of(cfg.data, 2, seed=7)
    with torch.no_grad():
        fixed_loss = model.loss(fixed, torch.Generator().manual_seed(3))
        x_t, t, _ = model.noised(model.clean_tokens(fixed), torch.Generator().manual_seed(4))
        model.unshard()  # velocity() is a plain method: FSDP2's forward hook does not run
        velocity = model.velocity(x_t, t)
        model.reshard()

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {
        "model": model_state,
        "optim": optim_state,
        "train": json.dumps({"step": step, "loader": None}),
        "rng": {f"rank-{env.rank}": torch.get_rng_state()},  # a key per rank
        "ema": ema.state_dict(),
    }
    folder = root / f"step-{step}"
    state_dict_saver.save(state, checkpoint_id=str(folder))
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    full_ema = {fqn: t.full_tensor() for fqn, t in ema.state_dict().items()}  # a collective
    if env.rank == 0:
        # fp32: what the tests compare across processes (auto is bf16 on some CPUs).
        frozen = cfg.model_copy(
            update={"train": cfg.train.model_copy(update={"precision": "fp32"})}
        )
        write_commit(str(folder), step=step, world_size=env.world_size, mesh={"shard": 2},
                     texts={CONFIG_NAME: frozen_text(frozen, str(TINY))})  # fmt: skip
        torch.save(
            {
                "state": full,
                "ema": full_ema,
                "batch": fixed,
                "loss": fixed_loss,
                "x_t": x_t,
                "t": t,
                "velocity": velocity,
            },
            reference,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
