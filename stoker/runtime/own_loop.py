"""Your own training loop with stoker's guarantees: what `stoker.job` (the public
module, stoker/job.py) is made of.

`init()` does for a user's script what stoker/runtime/train.py does for the built-in
trainer, from the same variables and frozen config the launcher gives every task:

    the process group    rendezvous.join: every rank joined or a named failure; the
                         device mesh (FSDP on a node, HSDP across nodes)
    stop requests        SIGUSR2, SIGTERM and the stop file (stop_request.py), agreed
                         by all ranks in `should_stop()`, the loop's one collective
    the hang watchdog    a heartbeat per rank (heartbeat.py), beating in should_stop()
    stragglers           each rank's own time between two should_stop() calls (and
                         its data wait, with `run.loader()`), gathered there
    MLflow               rank 0 logs into the job's run (rank_tracking.py): spooled
                         through outages, each step once across requeues; the data
                         sets the run reads as its dataset inputs (data_lineage.py)
    progress             rank 0's progress.json for `stoker status` (step, loss, ETA)
    exit codes           75 requeue, 143 terminated, 76 a lost peer, 124 a hang, 1 an
                         error: the batch script reads them as it reads the trainer's

and `Checkpoint` (own_checkpoint.py) is the trainer's verified async checkpointer.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from stoker.config import ExperimentConfig, load_frozen
from stoker.errors import StokerError
from stoker.protocol import (
    ENV_CONFIG,
    ENV_RESTART,
    ENV_RUN_DIR,
    EXIT_HANG,
    EXIT_PEER_LOST,
    EXIT_REQUEUE,
)
from stoker.runtime import dist_env, flight_recorder, rendezvous
from stoker.runtime.data_lineage import record_data_sets
from stoker.runtime.dist_env import DistEnv
from stoker.runtime.heartbeat import (
    COLLECTIVE_PHASE,
    Heartbeat,
    announce_exit,
    hang_reported,
    interval_for,
    silent_ranks,
)
from stoker.runtime.progress import Progress
from stoker.runtime.rank_tracking import Tracking, open_tracking
from stoker.runtime.stop_request import StopRequest
from stoker.runtime.stragglers import Slowest, node_name

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from stoker.data.stream.loader import StreamingLoader
    from stoker.runtime.own_checkpoint import Checkpoint

EXIT_TERMINATED = 128 + 15

_current: Run | None = None


class JobLoader:
    """stoker's streaming loader of the experiment's `data.*` keys, as `run.loader()`
    gives it: `batches()` is endless and goes on from the loader's position (restored
    by `Checkpoint.restore()`), and the time each rank waits for a batch is its data
    wait in the straggler report."""

    def __init__(self, loader: StreamingLoader, run: Run) -> None:
        self.loader, self._run = loader, run

    def batches(self) -> Iterator[dict[str, Any]]:
        """Batches on the run's device (tensors; lists and dicts as they are)."""
        stream = iter(self.loader.batches())
        device = self._run.device
        while True:
            started = time.perf_counter()
            batch = next(stream)
            self._run._data_s += time.perf_counter() - started
            yield {
                k: v.to(device, non_blocking=True)
                if isinstance(v, torch.Tensor) and k != "position"
                else v
                for k, v in batch.items()
            }

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class Run:
    """This rank's place in the job and its services; made by `init()`, one per process."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        env: DistEnv,
        device: torch.device,
        run_dir: Path,
        restart: int,
        stop: StopRequest,
    ) -> None:
        self.config = cfg
        """The job's frozen experiment (`stoker submit EXP.yaml k=v -- python train.py`)."""
        self.env, self.device, self.run_dir, self.restart = env, device, run_dir, restart
        self._stop = stop
        self.mesh: DeviceMesh | None = None
        self._tracking: Tracking | None = None
        self._heartbeat: Heartbeat | None = None
        self._progress: Progress | None = None
        self._step = 0  # steps done: set by Checkpoint.restore(), +1 per should_stop()
        self._start_step = 0
        self._synced_at: float | None = None  # when the last should_stop() returned
        self._own_s, self._data_s = 0.0, 0.0  # this rank's, since the last should_stop()
        # Since the last log(), on rank 0: steps, and every rank's own and data seconds
        # summed (sums, not rows: a loop that never logs must not grow them).
        self._window_steps = 0
        self._window_sums: list[float] = []  # [own_0, data_0, own_1, data_1, ...]
        self._window_started = time.perf_counter()
        self._hosts: list[str] | None = None
        self._checkpoints: list[Checkpoint] = []
        self._ended = False

    # --- where this rank stands -----------------------------------------------------

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one whose `log()` is recorded."""
        return self.env.is_main

    @property
    def run_id(self) -> str | None:
        """The job's MLflow run."""
        return self._tracking.run_id if self._tracking is not None else None

    # --- what the loop uses -----------------------------------------------------------

    def checkpointer(
        self,
        *,
        model: nn.Module,
        optim: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        loader: Any = None,
    ) -> Checkpoint:
        """The job's verified, async, resharding checkpoints of these objects (and each
        rank's RNG): under checkpoint.root, else the run folder's checkpoints/. `loader`:
        anything with `state_dict()` (JSON-able) and `load_state_dict()`, e.g.
        `run.loader()` or torchdata's StatefulDataLoader. Call on every rank."""
        from stoker.runtime.own_checkpoint import Checkpoint

        checkpoint = Checkpoint(self, model, optim, scheduler, loader)
        self._checkpoints.append(checkpoint)
        return checkpoint

    def loader(self) -> JobLoader:
        """stoker's streaming loader of the experiment's data (`data.*`: data.url, or the
        mixture data.sources, with data.buckets if set; the synthetic audio-video set
        when neither is set), this rank's share of each global batch (of data.batch_size
        samples, or of its bucket's batch size). Call on every rank."""
        from stoker.data.stream.loader import loader_from_config

        cfg = self.config
        url = cfg.data.url
        if url is None and not cfg.data.sources:
            from stoker.data.synthetic.default_set import ensure_synthetic_data

            url = str(ensure_synthetic_data(cfg.data, progress=print if self.is_main else None))
            if self.is_main and self._tracking is not None:
                record_data_sets(self._tracking, cfg.data, evaluates=False)
        if not cfg.data.buckets and cfg.data.batch_size % self.world_size:
            raise StokerError(
                f"data.batch_size {cfg.data.batch_size} does not split over "
                f"{self.world_size} ranks",
                fix=f"use a data.batch_size that is a multiple of {self.world_size}",
            )
        with_url = cfg.model_copy(update={"data": cfg.data.model_copy(update={"url": url})})
        return JobLoader(
            loader_from_config(with_url, rank=self.rank, world_size=self.world_size), self
        )

    def log(self, metrics: Mapping[str, float | torch.Tensor], step: int) -> None:
        """Record `metrics` at `step` in the job's MLflow run, from rank 0 (call it on
        every rank or on rank 0 alone: no collective; other ranks' values are not
        recorded, so log values all ranks agree on, e.g. all-reduced). Returns at once:
        spooled through store outages, and a step logged before a requeue is not
        logged twice. Also writes progress.json (`stoker status`: step, loss, ETA)
        and the straggler metrics of the steps since the last log."""
        if not self.is_main:
            return
        values = {k: float(v) for k, v in metrics.items()}
        slowest = self._slowest()
        if self._window_steps:
            elapsed = time.perf_counter() - self._window_started
            values["system/time/step_s"] = elapsed / self._window_steps
        if slowest is not None:
            values.update(slowest.metrics())
        self._window_steps, self._window_sums = 0, []
        self._window_started = time.perf_counter()
        if self._tracking is not None:
            self._tracking.log_metrics(values, step)
        if self._progress is None:
            self._progress = Progress(self.config.train.steps, self._start_step)
        self._progress.update(step, values, slowest)

    def should_stop(self) -> bool:
        """Whether the job must stop now (preemption, time limit, `scancel`,
        `scontrol requeue`), agreed by every rank: a collective, call it once per step
        on every rank, then save and `exit_for_requeue()` when it says so. It is also
        the step's heartbeat (a rank that stops calling it for train.hang_timeout_s
        has hung: the watchdog fails the job with every rank's stack) and where the
        ranks' step times are compared."""
        now = time.perf_counter()
        own = now - self._synced_at if self._synced_at is not None else 0.0
        heartbeat = self._beat(COLLECTIVE_PHASE)  # at the end of step _step + 1
        mine = torch.tensor([float(self._stop.wanted()), own, self._data_s], device=self.device)
        if self.env.distributed:
            if self._hosts is None:
                hosts: list[Any] = [None] * self.world_size
                torch.distributed.all_gather_object(hosts, node_name())
                self._hosts = [str(h) for h in hosts]
            rows_t = torch.empty(self.world_size * 3, device=self.device)
            dist_env.all_gather_flat(rows_t, mine)
            rows = rows_t.view(self.world_size, 3).tolist()
        else:
            rows = [mine.tolist()]
        self._step += 1
        if heartbeat is not None:
            heartbeat.beat(self._step + 1, "step")  # the next step has begun
        if self._synced_at is not None and self.is_main:
            flat = [value for row in rows for value in row[1:]]
            sums = self._window_sums or [0.0] * len(flat)
            self._window_sums = [a + b for a, b in zip(sums, flat, strict=True)]
            self._window_steps += 1
        self._synced_at, self._data_s = time.perf_counter(), 0.0
        return any(row[0] > 0 for row in rows)

    def exit_for_requeue(self) -> NoReturn:
        """End this process so that the job goes on later from the last checkpoint:
        exit 75 (the batch script requeues the job) after a stop request, 143 after
        SIGTERM (SLURM requeues or ends the job itself). The MLflow run stays open
        for the next start. Save first (`checkpoint.save(step, wait=True)`)."""
        terminated = self._stop.terminated
        code = EXIT_TERMINATED if terminated else EXIT_REQUEUE
        self._end(code, "KILLED" if terminated else None)
        sys.exit(code)

    def finish(self) -> None:
        """The loop is done: wait for checkpoints in flight, end the MLflow run
        FINISHED, leave the process group. Call it on every rank."""
        self._end(0, "FINISHED")

    # --- inside ---------------------------------------------------------------------

    def _beat(self, phase: str) -> Heartbeat | None:
        """This rank's heartbeat in `phase` of step _step + 1 (1-based), started when
        the loop starts (restore() or the first should_stop()): not while the script
        builds and loads, which may rightly take long."""
        timeout = self.config.train.hang_timeout_s
        if not timeout:
            return None
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(
                self.run_dir,
                rank=self.rank,
                world_size=self.world_size,
                restart=self.restart,
                timeout_s=timeout,
            )
            self._heartbeat.start()
        self._heartbeat.beat(self._step + 1, phase)
        return self._heartbeat

    def _slowest(self) -> Slowest | None:
        """The slowest rank of the steps since the last log (several ranks)."""
        if not self._window_steps or self._hosts is None:
            return None
        steps, sums = self._window_steps, self._window_sums
        own = [sums[2 * r] / steps for r in range(self.world_size)]
        data = [sums[2 * r + 1] / steps for r in range(self.world_size)]
        compute = [max(o - d, 0.0) for o, d in zip(own, data, strict=True)]
        return Slowest.of(data, compute, self._hosts)

    def _set_start(self, step: int) -> None:
        """Checkpoint.restore() says where the loop starts: its first step begins."""
        self._step = self._start_step = step
        self._beat("step")

    def _end(self, code: int | None, status: str | None) -> None:
        """Close everything once, in the order the trainer does: say the exit code
        first (the batch script reads it if SLURM kills this rank on its way out);
        `code` None: not known (the script ended without finish())."""
        if self._ended:
            return
        self._ended = True
        if code is not None:
            peers = self._frozen_peers(code)
            announce_exit(self.run_dir, self.restart, self.rank, code, peers)
        for checkpoint in self._checkpoints:
            checkpoint.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._progress is not None:
            self._progress.close()
        if self._tracking is not None:
            self._tracking.close(status)
        if code != EXIT_PEER_LOST and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        # As train.py: a stop that comes while the process exits must not kill it.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)

    def _at_exit(self) -> None:
        """atexit: a script that ended without finish() or exit_for_requeue() still
        sends what it logged (the MLflow writer is a daemon thread) and lets a save in
        flight commit; the run's final state then comes from the job's end."""
        self._end(None, None)

    def _frozen_peers(self, code: int) -> list[int]:
        """For a lost peer: the ranks whose heartbeat went silent (train.py)."""
        cfg = self.config.train
        if code != EXIT_PEER_LOST or not cfg.hang_timeout_s:
            return []
        silent_s = max(cfg.collective_timeout_s / 2, 3 * interval_for(cfg.hang_timeout_s))
        found = silent_ranks(self.run_dir, self.restart, self.world_size, silent_s)
        return [r for r in found if r != self.rank]

    def _on_uncaught(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        """sys.excepthook: the script failed. Its exit code as the trainer's would be,
        the MLflow run FAILED, unless the hang watchdog or a lost peer explains it."""
        err = sys.__stderr__ or sys.stderr  # the process's, whatever wraps sys.stderr
        if issubclass(kind, KeyboardInterrupt):
            traceback.print_exception(kind, exc, tb, file=err)
            self._end(EXIT_TERMINATED, "KILLED")
            os._exit(130)
        if hang_reported(self.run_dir, self.restart):
            print(f"stoker: rank {self.rank}: stopped by the hang watchdog "
                  "(heartbeat/…/hang.json)", file=err, flush=True)  # fmt: skip
            self._end(EXIT_HANG, "FAILED")
            os._exit(EXIT_HANG)
        if isinstance(exc, StokerError):
            print(f"stoker: rank {self.rank}: {exc}", file=err, flush=True)
            code = 1
        else:
            traceback.print_exception(kind, exc, tb, file=err)
            code = EXIT_PEER_LOST if dist_env.lost_peer(exc) else 1
            if code == EXIT_PEER_LOST:
                print(f"stoker: rank {self.rank}: a collective lost a peer; exit "
                      f"{EXIT_PEER_LOST}", file=err, flush=True)  # fmt: skip
                flight_recorder.dump(self.rank)
        err.flush()
        self._end(code, "FAILED")
        sys.stdout.flush()
        os._exit(code)


def init(config: str | Path | None = None) -> Run:
    """Join the job: this rank's place, device and process group (every rank joined,
    or a failure naming the missing ones within train.rendezvous_timeout_s), the stop
    signals, the job's MLflow run, the hang watchdog. Call it first, on every rank,
    once. `config`: the experiment file; default, the job's frozen one
    ($STOKER_CONFIG, set by `stoker submit` and `stoker run`)."""
    global _current
    if _current is not None:
        raise StokerError(
            "stoker.job.init() was called twice in this process",
            fix="call it once and pass the Run it returns along",
        )
    sys.excepthook = _user_errors_plainly  # until there is a Run to end
    stop = StopRequest()
    stop.install()
    path = Path(config) if config is not None else _config_path()
    cfg = load_frozen(path)
    env = dist_env.detect()
    device = dist_env.device_for(env)
    if device.type == "cpu":
        torch.set_num_threads(dist_env.cpu_threads(env))
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or path.resolve().parent)
    restart = int(os.environ.get(ENV_RESTART) or 0)
    run = Run(cfg, env, device, run_dir, restart, stop)
    _current = run
    sys.excepthook = run._on_uncaught
    atexit.register(run._at_exit)
    rendezvous.join(
        env,
        device,
        rendezvous_timeout_s=cfg.train.rendezvous_timeout_s,
        collective_timeout_s=cfg.train.collective_timeout_s,
    )
    # Again: init_process_group wraps the hook in one that buffers stderr until the hook
    # returns, and this one ends the process (its exit code) before that.
    sys.excepthook = run._on_uncaught
    run.mesh = dist_env.data_parallel_mesh(env, device)
    run._tracking = open_tracking(cfg, env, device, run_dir, path)
    if env.is_main:  # the data sets the config names (the synthetic one: run.loader())
        record_data_sets(run._tracking, cfg.data, evaluates=True, synthetic=False)
    # The same seed on every rank: the same initial weights before sharding.
    torch.manual_seed(cfg.train.seed)
    return run


def _user_errors_plainly(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """A StokerError before the job is joined: its message and fix, no traceback."""
    if isinstance(exc, StokerError):
        print(f"stoker: {exc}", file=sys.__stderr__ or sys.stderr, flush=True)
    else:
        sys.__excepthook__(kind, exc, tb)


def _config_path() -> Path:
    value = os.environ.get(ENV_CONFIG)
    if not value:
        raise StokerError(
            "stoker.job.init() found no job: $STOKER_CONFIG is not set",
            fix="start the script with `stoker run -- python train.py` (here) or "
            "`stoker submit EXP.yaml -- python train.py` (SLURM), or pass "
            "init(config='exp.yaml')",
        )
    return Path(value)
