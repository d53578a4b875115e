"""The training loop: build, then steps until done or told to stop.

    for each optimizer step:
        take grad_accum micro-batches from the loader         (data wait)
        forward + backward each, bf16 autocast                (fwd+bwd)
        clip the global gradient norm; one all-reduce of
          [non-finite?, stop wanted?] over the ranks           (the step's only sync)
        optimizer and schedule step, unless non-finite         (optimizer)
          and the weights' moving average (train.ema_decay, ema.py)
        every log_every steps: one all-gather of the window's metrics and each
          rank's own time (stragglers.py), evaluate every eval_every, log
        on a stop request: save, exit EXIT_REQUEUE (75)
        every checkpoint.every steps: save (in the background with checkpoint.async)
        every sample_every steps: clips from fixed seeds to MLflow (train_samples.py)

Losses and norms stay on the device between log steps; the flags all-reduce is
the one host sync per step (a skipped step must be decided on every rank).
Heartbeat, profiler and per-rank timing watch the step from one object (runtime's
observe/step_watch.py); what is reported goes to a `MetricsSink` (observe/metrics_sink.py).
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from stoker import metric_names as names
from stoker.checkpoint.checkpointer import Checkpointer
from stoker.checkpoint.train_state import TrainState
from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.modes import RunEnd
from stoker.protocol import ENV_RESTART, EXIT_REQUEUE, EXIT_TERMINATED
from stoker.runtime.dist import context_mesh, dist_env
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.dist.parallelize import parallelize
from stoker.runtime.dist.precision import resolve_precision
from stoker.runtime.ema import EMA, EMA_KEY
from stoker.runtime.eval_data import held_out_loader
from stoker.runtime.models import contract
from stoker.runtime.models.context_parallel import GroupContextParallel, without_context_parallel
from stoker.runtime.observe.heartbeat import COLLECTIVE_PHASE
from stoker.runtime.observe.log_window import (
    GATHERED,
    LOADER_COUNTERS,
    ModelMetrics,
    Window,
    across_ranks,
    column,
)
from stoker.runtime.observe.metrics_sink import MetricsSink, NullSink
from stoker.runtime.observe.progress import Progress
from stoker.runtime.observe.step_memory import StepMemory, local_bytes
from stoker.runtime.observe.step_watch import StepWatch
from stoker.runtime.observe.stragglers import Slowest
from stoker.runtime.observe.time_account import StartAccount
from stoker.runtime.optim import build_optimizer, build_scheduler
from stoker.runtime.session import (
    DeviceBatch,
    check_batch_split,
    data_url,
    rank_hosts,
    to_device,
)
from stoker.runtime.stop_request import StopRequest
from stoker.runtime.train_samples import TrainSampler

# A step whose loss or gradient norm is not finite is skipped; this many in a
# row means the run has diverged and stops (FAILED) instead of burning hours.
MAX_NONFINITE_IN_ROW = 5


@dataclass
class Outcome:
    exit_code: int
    status: RunEnd  # REQUEUE: the run goes on
    step: int


class Trainer:
    def __init__(
        self,
        cfg: ExperimentConfig,
        env: DistEnv,
        device: torch.device,
        *,
        run_dir: Path,
        sink: MetricsSink | None = None,
        mesh: DeviceMesh | None = None,
        mlflow_run_id: str | None = None,
        stop: StopRequest | None = None,
        marks: Mapping[str, float] | None = None,
        cp: GroupContextParallel | None = None,
    ) -> None:
        self.cfg, self.env, self.device, self.mesh = cfg, env, device, mesh
        # Context parallelism: the data is split over the CP groups (context_mesh.py).
        self.cp, self.data_share = cp, context_mesh.data_share(env, cp)
        self.data_rank, self.data_world = self.data_share
        self.marks = dict(marks or {})  # the session's (time account's start line)
        self.run_dir = run_dir
        self.sink: MetricsSink = sink or NullSink()
        self.mlflow_run_id = mlflow_run_id
        self.stop = stop or StopRequest()
        self.checkpoint_root = cfg.checkpoint.root or str(run_dir / "checkpoints")
        accum = cfg.train.grad_accum
        check_batch_split(cfg.data, self.data_world, accum)
        self.micro_batch = cfg.data.batch_size // accum  # global, per loader batch
        self.precision = resolve_precision(cfg.train.precision, device)
        self.slowest: Slowest | None = None  # of the last log window, with several ranks
        self._hosts: list[str] | None = None  # every rank's node, gathered at the first log
        self._tagged_host: str | None = None

    # --- build -------------------------------------------------------------------

    def build(self) -> None:
        from stoker.data.stream.loader import loader_from_config
        from stoker.kernels import set_backend
        from stoker.runtime.models import build_model

        cfg = self.cfg
        set_backend(cfg.model.kernels)
        if self.env.is_main:
            print(self.precision.reason, flush=True)
            if self.precision.warning:
                print(f"warning: {self.precision.warning}", file=sys.stderr, flush=True)
            self.sink.set_tags({"stoker.precision": self.precision.value})
        # Same seed on every rank: identical initial weights before sharding.
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, cfg.data).to(self.device)
        precision = self.precision.value
        self.model: nn.Module = parallelize(model, cfg.train, self.mesh, self.device, precision)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, cfg.train.steps)
        torch.manual_seed(cfg.train.seed * 100_003 + self.env.rank)
        self.loader = loader_from_config(
            cfg,
            rank=self.data_rank,
            world_size=self.data_world,
            micro_batches=cfg.train.grad_accum,
            url=data_url(cfg.data, say=print if self.env.is_main else None),
        )
        every = cfg.train.eval_every
        self.eval_loader = held_out_loader(cfg, self.env, *self.data_share) if every else None
        self.costs = contract.SampleCosts(self.model)  # FLOPs and tokens per batch shape
        self._said_no_flops = False
        self.model_metrics = ModelMetrics(self.env, self.device, type(model).__name__)
        self._loader_seen: dict[str, float] = {}  # the loader's counters at the last log
        self._generators: list[torch.Generator] = []
        self._checkpoint_s = self._sample_s = 0.0  # since the last log step
        self.start_step = 0
        decay = cfg.train.ema_decay
        self.ema = EMA(self.model, decay) if decay is not None else None
        self.sampler = TrainSampler(
            cfg,
            self.env,
            run_dir=self.run_dir,
            sink=self.sink,
            ema=self.ema,
            autocast=self.autocast,
        )
        self.sampler.check(self.model)
        ema_bytes = local_bytes(self.ema.shadow.values()) if self.ema else 0
        self.step_memory = StepMemory(
            self.run_dir,
            self.device,
            enabled=self.env.is_main,
            trace_cpu=cfg.train.measure_memory,
            ema_bytes=ema_bytes,
        )
        # This start's time account (time_account.py), on global rank 0.
        restart = int(os.environ.get(ENV_RESTART) or 0)
        self.account = StartAccount(self.run_dir, restart=restart, enabled=self.env.is_main)
        self.checkpointer = self._checkpointer()
        state = self.checkpointer.load_latest(
            self.model, self.optimizer, self.scheduler, extra=self._extra()
        )
        if state is not None:
            self.start_step = state.step
            if state.loader is not None:
                self.loader.load_state_dict(state.loader)
            if self.env.is_main:
                print(f"resumed from {self.checkpoint_root}/step-{state.step}", flush=True)
            if self.ema is not None and EMA_KEY not in state.extra_loaded:
                self.ema.reset()  # the checkpoint has none: start it at the resumed weights
                if self.env.is_main:
                    print(
                        f"warning: step-{state.step} has no EMA weights (saved without "
                        "train.ema_decay): the average starts at its weights",
                        flush=True,
                    )

    def _extra(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """The state saved beside the model: the EMA weights, with train.ema_decay."""
        return {EMA_KEY: self.ema.state_dict()} if self.ema is not None else None

    def _checkpointer(self) -> Checkpointer:
        from stoker.runtime.job_checkpointer import checkpointer_for

        return checkpointer_for(
            self.cfg,
            self.checkpoint_root,
            rank=self.env.rank,
            world_size=self.env.world_size,
            mesh=self.mesh,
            sink=self.sink if self.env.is_main else None,
            on_commit=self.account.committed,
            run_dir=self.run_dir,
        )

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over train.eval_batches held-out batches, over all ranks;
        each sample's noise is keyed by its position, so evaluations compare."""
        assert self.eval_loader is not None
        self.model.eval()
        self.eval_loader.position = 0
        total = torch.zeros((), device=self.device)
        count = 0
        for batch in self.eval_loader.batches(max_batches=self.cfg.train.eval_batches):
            batch = to_device(batch, self.device)
            with self.autocast():
                loss, _ = contract.loss_and_metrics(self.model, self._with_noise(batch))
                total += loss.float()
            count += 1
        self.model.train()
        stats = torch.stack([total, torch.tensor(float(count), device=self.device)])
        if self.env.distributed:
            torch.distributed.all_reduce(stats)
        loss_sum, batches = stats.tolist()
        return float(loss_sum / max(batches, 1.0))

    # --- the loop ------------------------------------------------------------------

    def autocast(self) -> AbstractContextManager[Any]:
        if self.precision.value == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _batches(self) -> Iterator[DeviceBatch]:
        batches = self.loader.batches()
        if self.cp is not None:  # read on CP rank 0, broadcast to the group
            batches = context_mesh.group_batches(batches if self.cp.rank == 0 else None, self.cp)
        for batch in batches:
            yield DeviceBatch.of(batch, self.device)

    def noise_for(self, batch: dict[str, Any]) -> list[torch.Generator]:
        """One generator per sample, seeded by (train.seed, the sample's stream
        position): a sample's diffusion noise and timestep are the same whatever
        the number of ranks, workers or restarts, as its data is (the loader's
        order is a function of the seed and position too). So a resumed run
        repeats an uninterrupted one, and 4 ranks repeat 1 with the same global
        batch. Libraries drawing from the global RNG (a DataLoader iterator
        takes its seed from it) cannot shift it."""
        positions = batch["position"].tolist()
        while len(self._generators) < len(positions):
            self._generators.append(torch.Generator(device=self.device))
        seed = self.cfg.train.seed
        for generator, position in zip(self._generators, positions, strict=False):
            generator.manual_seed((seed * 1_000_003 + int(position)) % 2**63)
        return self._generators[: len(positions)]

    def _with_noise(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as a model gets it (stoker/model.py): with its per-sample generators."""
        return {**batch, "generators": self.noise_for(batch)}

    def _cost(self, batch: dict[str, Any]) -> contract.SampleCost:
        """FLOPs and tokens per sample of this batch's shape (asked once per shape)."""
        cost = self.costs.of(batch)
        if cost.flops is None and not self._said_no_flops and self.env.is_main:
            print(
                f"{type(self.model).__name__} has no flops_per_sample(batch): no MFU "
                "(stoker/model.py)",
                flush=True,
            )
            self._said_no_flops = True
        return cost

    def train(self) -> Outcome:
        """Train from `start_step` to train.steps; a stop request ends it after a save."""
        cfg, env = self.cfg, self.env
        total, accum = cfg.train.steps, cfg.train.grad_accum
        self.stop.install()
        batches = self._batches()
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = cfg.optim.grad_clip if cfg.optim.grad_clip is not None else math.inf
        watch = StepWatch(
            cfg.train,
            self.run_dir,
            rank=env.rank,
            world_size=env.world_size,
            device=self.device,
            blocks=contract.blocks_of(self.model),
        )
        progress = Progress(total, self.start_step) if env.is_main else None
        window, bad_in_row, step = Window(), 0, self.start_step
        account = self.account
        account.start(self.start_step, env.world_size, self.marks)
        outcome: Outcome | None = None
        try:
            while step < total:
                account.first_step()
                watch.begin(step + 1)
                with watch.phase("data"):
                    micro = [next(batches) for _ in range(accum)]
                watch.lap("data")
                with self.step_memory.measure(micro, self.model, self.optimizer):
                    loss_sum = self._forward_backward(micro, watch, window)
                    grad_norm = self._clip_grad_norm(params, max_norm)
                    nonfinite, stop_wanted = self._agree(loss_sum, grad_norm, watch)  # host sync
                    watch.lap("fwd_bwd")
                    if nonfinite:
                        bad_in_row += 1
                        window.skipped_steps += 1
                        self._skip(step + 1, bad_in_row)
                    else:
                        bad_in_row = 0
                        with watch.phase("optimizer"):
                            self.optimizer.step()
                            self.scheduler.step()
                            if self.ema is not None:
                                self.ema.update()
                        window.add_good_step(loss_sum, grad_norm)
                    self.optimizer.zero_grad(set_to_none=True)
                step += 1
                window.add_step(watch.end(step))
                if step % cfg.train.log_every == 0 or step == total or stop_wanted:
                    watch.beat("log")
                    logged = self._log(step, window, progress)
                    self.step_memory.write(env.world_size, self.precision.value)
                    self._account(account, step, window, logged)
                    window = Window()
                if self.sampler.due(step):
                    watch.beat("sample")
                    began = time.perf_counter()
                    with without_context_parallel():  # each rank draws whole clips
                        self.sampler.draw(self.model, step)
                    self._sample_s += time.perf_counter() - began
                watch.beat("save")
                if stop_wanted:
                    self.save(step, wait=True)
                    if self.stop.terminated:
                        outcome = Outcome(EXIT_TERMINATED, "KILLED", step)
                    else:
                        outcome = Outcome(EXIT_REQUEUE, "REQUEUE", step)
                    return outcome
                every = cfg.checkpoint.every
                if every and step % every == 0 and step < total:
                    self.save(step)
            self.save(step, wait=True)
            if env.is_main:
                self._final_model(step)
            outcome = Outcome(0, "FINISHED", step)
            return outcome
        finally:
            account.end(
                step,
                outcome.status if outcome is not None else "FAILED",
                checkpoint_s=self._checkpoint_s,
                sample_s=self._sample_s,
            )
            self.sampler.close()
            for path in watch.close():
                if env.is_main:
                    self.sink.log_artifact(path, "profile")
            if progress is not None:
                progress.close()

    def _forward_backward(
        self, micro: list[DeviceBatch], watch: StepWatch, window: Window
    ) -> torch.Tensor:
        """Forward and backward of each micro-batch; the step's loss, on the device.

        A model's loss is the mean over a batch's valid rows (stoker/model.py). Each
        micro-batch weighs its share of the step's valid rows, so the step's loss is
        the mean over all of them: 1/accum each when no sample was skipped, 0 for a
        micro-batch that holds stand-ins only."""
        accum = len(micro)
        valid_total = max(sum(m.valid_rows for m in micro), 1)
        loss_sum = torch.zeros((), device=self.device)
        for index, micro_batch in enumerate(micro):
            if isinstance(self.model, FSDPModule):
                # FSDP2: reduce-scatter gradients on the last micro-batch only.
                self.model.set_requires_gradient_sync(index == accum - 1)
            batch = self._with_noise(micro_batch)
            window.add_batch(micro_batch.rows, micro_batch.skipped, self._cost(batch))
            with watch.phase("forward"), self.autocast():
                loss: Any
                loss, metrics = contract.loss_and_metrics(self.model, batch)
                # x 1.0 exactly, then / accum, when every micro-batch is whole.
                loss = loss * (micro_batch.valid_rows * accum / valid_total) / accum
            self.model_metrics.add(metrics)
            with watch.phase("backward"):
                loss.backward()
            loss_sum += loss.detach().float()
        return loss_sum

    def _clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """The global gradient norm (before clipping to `max_norm`), a plain tensor."""
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        return grad_norm

    def _agree(
        self, loss_sum: torch.Tensor, grad_norm: torch.Tensor, watch: StepWatch
    ) -> tuple[bool, bool]:
        """(non-finite on some rank, stop wanted by some rank): one all-reduce (MAX) of
        two flags, and the step's one host sync. Every rank must skip the same steps
        and stop at the same one."""
        flags = torch.stack(
            [
                (~torch.isfinite(loss_sum) | ~torch.isfinite(grad_norm)).float(),
                torch.tensor(float(self.stop.wanted()), device=self.device),
            ]
        )
        watch.beat(COLLECTIVE_PHASE)
        if self.env.distributed:
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        nonfinite, stop_wanted = (bool(v) for v in flags.tolist())  # the sync
        return nonfinite, stop_wanted

    def _skip(self, step: int, bad_in_row: int) -> None:
        """Step `step` was non-finite and is skipped; the MAX_NONFINITE_IN_ROW-th
        in a row fails the run."""
        if self.env.is_main:
            print(f"step {step}: non-finite loss or gradient, skipped", flush=True)
        if bad_in_row >= MAX_NONFINITE_IN_ROW:
            raise StokerError(
                f"{bad_in_row} steps in a row had a non-finite loss or gradient "
                f"(last at step {step}): training diverged",
                fix="lower optim.lr, raise optim.warmup_steps, or set "
                "optim.grad_clip; check the data with `stoker data inspect`",
            )

    def _log(self, step: int, window: Window, progress: Progress | None) -> dict[str, float]:
        """A log step: the window's metrics over all ranks, the held-out loss every
        train.eval_every steps and at the end, into the sink and progress.json."""
        metrics = self._reduce(window)
        metrics.update(self.model_metrics.reduce())
        eval_every = self.cfg.train.eval_every
        if self.eval_loader is not None and (
            step % eval_every == 0 or step == self.cfg.train.steps
        ):
            metrics[names.EVAL_LOSS] = self.evaluate()
        self.sink.log_metrics(metrics, step)
        self._tag_slowest_host()
        if progress is not None:
            progress.update(step, metrics, self.slowest)
        return metrics

    def _reduce(self, window: Window) -> dict[str, float]:
        """The window's metrics over all ranks (log_window.across_ranks), and with several
        ranks the stragglers' (Slowest): one all-gather of `GATHERED` numbers per rank,
        so that every rank sees every rank's data wait and forward compute, not only
        their sum."""
        env = self.env
        good = window.steps - window.skipped_steps
        mine = window.gathered(self.device, self._loader_increments())
        if env.distributed:
            # Flat: gloo refuses a (ranks, n) output.
            gathered = torch.empty(env.world_size * len(GATHERED), device=self.device)
            dist_env.all_gather_flat(gathered, mine)
            rows = gathered.view(env.world_size, -1).tolist()  # the log step's one host sync
            self.slowest = Slowest.of(
                column(rows, "data_s"), column(rows, "forward_s"), self._rank_hosts()
            )
        else:
            rows = [mine.tolist()]
        total = context_mesh.once_per_group(across_ranks(rows), self.cp)
        elapsed = time.perf_counter() - window.started
        rank_s = elapsed * env.world_size  # per GPU (rank)
        metrics: dict[str, float] = {
            names.LOSS: total["loss_sum"] / good if good else math.nan,
            names.GRAD_NORM: total["grad_norm_max"],
            names.LR: float(self.scheduler.get_last_lr()[0]),
            names.SAMPLES_PER_S: total["rows"] / rank_s,
            names.STEP_S: elapsed / window.steps,
            names.DATA_WAIT_S: window.data_s / window.steps,
            names.FWD_BWD_S: window.fwd_bwd_s / window.steps,
            names.OPTIMIZER_S: window.optim_s / window.steps,
            names.SKIPPED_NONFINITE_STEPS: float(window.skipped_steps),
        }
        if total["tokens"]:
            metrics[names.TOKENS_PER_S] = total["tokens"] / rank_s
        from stoker.runtime.models.flops import peak_flops

        peak = peak_flops(self.device)
        if peak and total["flops"]:  # each batch's FLOPs at its own shape (buckets)
            metrics[names.MFU] = total["flops"] / rank_s / peak
        if self.device.type == "cuda":
            metrics[names.PEAK_GPU_MEMORY_GB] = torch.cuda.max_memory_allocated(self.device) / 1e9
        else:
            rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            metrics[names.PEAK_RSS_GB] = rss_kb / 1e6
        # Over the window's steps, summed over the ranks: the samples skipped in the
        # batches trained on (their rows were stand-ins, left out of the loss), and the
        # loader's other counters.
        metrics[names.SKIPPED_SAMPLES] = total["skipped_samples"]
        for name in LOADER_COUNTERS:
            metrics[names.loader_counter(name)] = total[name]
        if self.loader.mixture:  # each data set's samples and epochs so far (all ranks)
            for name, (samples, epochs) in self.loader.progress().items():
                metrics[names.source_samples(name)] = float(samples)
                metrics[names.source_epochs(name)] = epochs
        if self.slowest is not None:
            metrics.update(self.slowest.metrics())
        return metrics

    def _loader_increments(self) -> list[float]:
        """This rank's loader's LOADER_COUNTERS since the last log step."""
        stats = self.loader.stats()
        now = {name: float(getattr(stats, name)) for name in LOADER_COUNTERS}
        increments = [now[name] - self._loader_seen.get(name, 0.0) for name in LOADER_COUNTERS]
        self._loader_seen = now
        return increments

    def _rank_hosts(self) -> list[str]:
        """Every rank's node, by rank: one all_gather_object at the first log of this
        start (every rank reaches it there), none after."""
        if self._hosts is None:
            self._hosts = rank_hosts(self.env.world_size)
        return self._hosts

    def _tag_slowest_host(self) -> None:
        """The run's tag `stoker.slowest_host`, set again when the slowest node changes
        (metrics are numbers; a node is a name). Global rank 0 only."""
        if self.slowest is None or not self.env.is_main:
            return
        if self.slowest.host != self._tagged_host:
            self.sink.set_tags({"stoker.slowest_host": self.slowest.host})
            self._tagged_host = self.slowest.host

    def _account(
        self, account: StartAccount, step: int, window: Window, metrics: dict[str, float]
    ) -> None:
        """The window's line of this start's time account (time_account.py)."""
        account.window(
            step,
            steps=window.steps,
            step_s=time.perf_counter() - window.started,
            data_s=window.data_s,
            checkpoint_s=self._checkpoint_s,
            sample_s=self._sample_s,
            metrics=metrics,
            slowest=self.slowest,
        )
        self._checkpoint_s = self._sample_s = 0.0

    def _final_model(self, step: int) -> None:
        """checkpoint.upload_final and train.register_final (final_model.py)."""
        from stoker.runtime import final_model

        url = self.checkpointer.url_for(step)
        if self.cfg.checkpoint.upload_final:
            final_model.upload_final(url, self.run_dir, self.sink, step)
        if self.cfg.train.register_final:
            self.sampler.close()  # the final samples written and queued first
            final_model.register_final(
                self.cfg,
                url,
                self.run_dir,
                run_id=self.mlflow_run_id,
                ema=self.ema is not None,
                samples_logged=self.sampler.due(step),
            )

    def save(self, step: int, *, wait: bool = False) -> None:
        """Save the state after `step`; with checkpoint.async the files are written
        while training goes on. `wait`: return once it has committed (or failed)."""
        began = time.perf_counter()
        loader = context_mesh.group_state(self.loader.state_dict(), self.cp)  # CP rank 0's
        state = TrainState(step, loader, self.mlflow_run_id)
        self.checkpointer.save(
            step, state, self.model, self.optimizer, self.scheduler, extra=self._extra()
        )
        if wait:
            self.checkpointer.wait()
        self._checkpoint_s += time.perf_counter() - began  # the loop was held this long
        if wait:
            failed = [m for s, m in self.checkpointer.failures if s == step]
            if failed:
                raise StokerError(
                    failed[0],
                    fix="check that checkpoint.root is writable "
                    "and has space; the run can resume from "
                    "the checkpoint before",
                )
