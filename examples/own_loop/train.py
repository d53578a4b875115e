"""A training loop of your own, with stoker's guarantees (stoker.job): it learns how
loud each frame of a clip sounds from the frame alone, on stoker's synthetic audio-video
set, sharded with FSDP2 on a node and HSDP across nodes.

    stoker run examples/own_loop/experiment.yaml -- python examples/own_loop/train.py
    stoker submit examples/own_loop/experiment.yaml --nodes 2 --ntasks-per-node 2 \\
        -- python examples/own_loop/train.py --width 64

Requeued (preemption, time limit, `scontrol requeue`), it goes on from its last
checkpoint with the same losses as a run that was never interrupted.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

from stoker import job


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Loudness(nn.Module):
    """Video frames uint8 [B, T, 3, H, W] -> each frame's log loudness [B, T]."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, kernel_size=4, stride=4)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        frames = video.flatten(0, 1).float() / 127.5 - 1.0
        x = F.gelu(self.stem(frames)).mean(dim=(2, 3))  # [B*T, width]
        x = x.view(video.shape[0], video.shape[1], -1)
        for block in self.blocks:
            x = block(x)
        # sum over the head's one output: a new tensor (FSDP2 warns of returned views)
        return self.head(x).sum(dim=-1)


def loudness(audio: torch.Tensor, frames: int) -> torch.Tensor:
    """Audio float [B, C, N] -> log mean power of each frame's stretch [B, frames]."""
    mono = audio.mean(dim=1)
    per_frame = mono.shape[1] // frames
    chunks = mono[:, : frames * per_frame].reshape(mono.shape[0], frames, per_frame)
    return chunks.pow(2).mean(dim=-1).add(1e-6).log()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    args = parser.parse_args()

    run = job.init()  # every rank joined; the job's config, MLflow run and signals
    cfg = run.config
    model = Loudness(args.width, args.depth).to(run.device)  # same seed on every rank
    if run.mesh is not None:  # FSDP2 within a node, HSDP across nodes
        for block in model.blocks:
            fully_shard(block, mesh=run.mesh)
        fully_shard(model, mesh=run.mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    loader = run.loader()  # this rank's share of data.batch_size clips, resumable
    ckpt = run.checkpointer(model=model, optim=optim, loader=loader)
    start = ckpt.restore()  # steps done by the newest verified checkpoint, else 0
    total, batches = cfg.train.steps, loader.batches()

    for step in range(start, total):
        batch = next(batches)
        valid = batch["valid"].float()  # rows that repeat an undecodable sample: 0
        error = model(batch["video"]) - loudness(batch["audio"], batch["video"].shape[1])
        loss = (error.pow(2).mean(dim=1) * valid).sum() / valid.sum().clamp(min=1.0)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        done = step + 1
        if done % cfg.train.log_every == 0 or done == total:
            mean = loss.detach().clone()
            if run.world_size > 1:
                torch.distributed.all_reduce(mean)
            run.log({"loss": mean.item() / run.world_size}, step=done)
        if run.should_stop():  # agreed by all ranks; also the step's heartbeat
            ckpt.save(done, wait=True)
            run.exit_for_requeue()
        if ckpt.due(done) and done < total:
            ckpt.save(done)  # in the background
    ckpt.save(total, wait=True)
    if run.is_main:
        print(f"finished at step {total}", flush=True)
    run.finish()


if __name__ == "__main__":
    main()
