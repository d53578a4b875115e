"""Samples while training: every `train.sample_every` steps and at the end, one clip
per seed of `train.sample_seeds` (the same seeds every time, so steps compare), with
the EMA weights where train.ema_decay keeps them, into the run's artifacts under
`samples/step-<N>/` (sample_files.py: mp4s or wavs, a contact sheet, samples.json).

Every rank draws its share of the seeds (ceil(K / ranks), the last seed repeated to
fill a share: under FSDP2 every rank must make the same calls on the sharded model),
then rank 0 gathers them (one all_gather_object of CPU tensors) and encodes and logs
them in a thread of its own while training goes on. So the other ranks wait for the
sampling alone, never for the encoding or the upload.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.ema import EMA
from stoker.runtime.observe.metrics_sink import MetricsSink
from stoker.runtime.sampling.draw import check_samplable, sample_model
from stoker.runtime.sampling.files import write_samples

ARTIFACT_FOLDER = "samples"
T = TypeVar("T")


def share_of(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """The seeds (or prompts) rank `rank` draws: its slice of ceil(K / world_size),
    padded with the last so that every rank draws as many."""
    share = math.ceil(len(items) / world_size)
    mine = list(items[rank * share : (rank + 1) * share])
    return mine + [items[-1]] * (share - len(mine))


def prompts_for(seeds: Sequence[int], prompts: Sequence[str]) -> list[str | None] | None:
    """train.sample_prompts, cycled to one per seed; None without prompts."""
    if not prompts:
        return None
    return [prompts[i % len(prompts)] for i in range(len(seeds))]


@contextmanager
def full_weights(model: nn.Module) -> Iterator[None]:
    """FSDP2's root parameters gathered for the block: sampling calls plain methods
    (velocity, logits), which its forward hook does not see; the blocks inside gather
    their own as they are called."""
    unshard = getattr(model, "unshard", None)
    if not callable(unshard):
        yield
        return
    unshard()
    try:
        yield
    finally:
        model.reshard()  # type: ignore[operator]


class TrainSampler:
    """Draws and logs the samples of train.sample_every; create it on every rank."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        env: DistEnv,
        *,
        run_dir: Path,
        sink: MetricsSink,
        ema: EMA | None,
        autocast: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.cfg, self.env, self.run_dir, self.sink = cfg, env, run_dir, sink
        self.ema, self.autocast = ema, autocast
        self.every = cfg.train.sample_every
        self._writer: ThreadPoolExecutor | None = None  # made at the first samples
        self._pending: list[Future[None]] = []

    def check(self, model: nn.Module) -> None:
        """A model without a sample() method draws no samples, said once, as a model
        without flops_per_sample has no MFU: train.sample_every may come from a shared
        experiment (the built-in one) that a plugin model is trained with."""
        if not self.every:
            return
        try:
            check_samplable(model)
        except StokerError as exc:
            self.every = 0
            if self.env.is_main:
                # str(exc) ends with its fix line: the fix is said once.
                print(f"train.sample_every: no samples: {exc}", flush=True)

    def due(self, step: int) -> bool:
        return bool(self.every) and (step % self.every == 0 or step == self.cfg.train.steps)

    def draw(self, model: nn.Module, step: int) -> None:
        """Sample at `step` on every rank (a collective); rank 0 then writes and logs
        them in the background."""
        train = self.cfg.train
        seeds = train.sample_seeds
        rank, ranks = self.env.rank, self.env.world_size
        mine = share_of(seeds, rank, ranks)
        prompts = prompts_for(seeds, train.sample_prompts)
        my_prompts = share_of(prompts, rank, ranks) if prompts is not None else None
        started = time.perf_counter()
        weights = self.ema.applied() if self.ema is not None else nullcontext()
        with weights, full_weights(model), self.autocast():
            drawn = sample_model(
                model,
                seeds=mine,
                steps=train.sample_steps,
                method=train.sample_method,
                prompts=my_prompts,
                guidance=train.sample_guidance,
            )
        local = {name: tensor.detach().cpu() for name, tensor in drawn.items()}
        rows: list[Any] = [local]
        if self.env.distributed:
            rows = [None] * self.env.world_size
            torch.distributed.all_gather_object(rows, local)
        if not self.env.is_main:
            return
        samples = {name: torch.cat([r[name] for r in rows])[: len(seeds)] for name in local}
        about: dict[str, Any] = {
            "step": step,
            "weights": "ema" if self.ema is not None else "model",
            "method": train.sample_method,
            "steps": train.sample_steps,
            "sampling_s": round(time.perf_counter() - started, 3),
        }
        if prompts is not None:
            about.update(prompts=prompts, guidance=train.sample_guidance)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stoker-samples")
        self._pending.append(self._writer.submit(self._write, samples, list(seeds), step, about))

    def _write(
        self, samples: dict[str, torch.Tensor], seeds: list[int], step: int, about: dict[str, Any]
    ) -> None:
        folder = self.run_dir / ARTIFACT_FOLDER / f"step-{step}"
        data = self.cfg.data
        try:
            write_samples(
                samples, seeds, folder, fps=data.fps, sample_rate=data.sample_rate, about=about
            )
        except Exception as exc:  # a sample that cannot be encoded must not stop training
            print(
                f"warning: the samples of step {step} were not written: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return
        self.sink.log_artifact(folder, f"{ARTIFACT_FOLDER}/step-{step}")
        print(
            f"step {step}: {len(seeds)} samples in {folder} ({about['sampling_s']:.1f} s to draw)",
            flush=True,
        )

    def close(self) -> None:
        """Wait for the samples being written, so they are logged before the run ends."""
        for job in self._pending:
            job.result()
        self._pending.clear()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
