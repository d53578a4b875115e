"""`stoker.job.init()` and the `Run` it returns: this rank's place in the job, and the
services a loop of one's own calls (see the package's docstring). The lifecycle under
it is the built-in trainer's (stoker/runtime/session.py)."""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import nn

from stoker import metric_names as names
from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.model import set_context_parallel
from stoker.process.gc_pause import pause_collector, resume_collector
from stoker.protocol import ENV_CONFIG, EXIT_REQUEUE, EXIT_TERMINATED
from stoker.runtime.dist import dist_env
from stoker.runtime.dist.context_mesh import data_share, training_mesh
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.observe.data_lineage import record_data_sets
from stoker.runtime.observe.heartbeat import COLLECTIVE_PHASE, Heartbeat
from stoker.runtime.observe.progress import Progress
from stoker.runtime.observe.stragglers import Slowest
from stoker.runtime.own_loop.checkpoint import Checkpoint
from stoker.runtime.own_loop.loader import DataWait, JobLoader
from stoker.runtime.session import JobSession, check_batch_split, data_url, rank_hosts
from stoker.runtime.stop_request import StopRequest

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from stoker.runtime.models.context_parallel import GroupContextParallel

_current: Run | None = None


class Run:
    """This rank's place in the job and its services; made by `init()`, one per process."""

    def __init__(self, session: JobSession) -> None:
        self.session = session
        """The job's lifecycle on this rank, shared with the built-in trainer."""
        self.config: ExperimentConfig = session.config
        """The job's frozen experiment (`stoker submit EXP.yaml k=v -- python train.py`)."""
        self.env: DistEnv = session.env
        self.device: torch.device = session.device
        self.run_dir: Path = session.run_dir
        self.restart: int = session.restart
        self.mesh: DeviceMesh | None = None
        self.cp: GroupContextParallel | None = None
        """train.context_parallel above 1: this rank's CP group (`stoker.model`'s
        attention, token_slice and cp_sum use it; docs/bring-your-own.md); else None."""
        self._heartbeat: Heartbeat | None = None
        self._progress: Progress | None = None
        self._step = 0  # steps done: set by Checkpoint.restore(), +1 per should_stop()
        self._start_step = 0
        self._synced_at: float | None = None  # when the last should_stop() returned
        self._data_wait = DataWait()  # this rank's wait for batches, likewise
        # Since the last log(), on rank 0: steps, and every rank's own and data seconds
        # summed (sums, not rows: a loop that never logs must not grow them).
        self._window_steps = 0
        self._own_sums: list[float] = []  # by rank
        self._data_sums: list[float] = []  # by rank
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
        tracking = self.session.tracking
        return tracking.run_id if tracking is not None else None

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
        checkpoint = Checkpoint(
            self.session, model, optim, scheduler, loader, on_restore=self._start_at, mesh=self.mesh
        )
        self._checkpoints.append(checkpoint)
        return checkpoint

    def loader(self) -> JobLoader:
        """stoker's streaming loader of the experiment's data (`data.*`: data.url, or the
        mixture data.sources, with data.buckets if set; the synthetic audio-video set
        when neither is set), this rank's share of each global batch (of data.batch_size
        samples, or of its bucket's batch size). Call on every rank."""
        from stoker.data.stream.loader import loader_from_config

        cfg = self.config
        url = data_url(cfg.data, say=print if self.is_main else None)
        tracking = self.session.tracking
        if url != cfg.data.url and self.is_main and tracking is not None:
            record_data_sets(tracking, cfg.data, evaluates=False)  # the synthetic set
        # With context parallelism, one share per CP group, read on its CP rank 0.
        data_rank, data_world = data_share(self.env, self.cp)
        check_batch_split(cfg.data, data_world)
        loader = loader_from_config(cfg, rank=data_rank, world_size=data_world, url=url)
        return JobLoader(loader, self.device, self._data_wait, self.cp)

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
            values[names.STEP_S] = elapsed / self._window_steps
        if slowest is not None:
            values.update(slowest.metrics())
        self._window_steps, self._own_sums, self._data_sums = 0, [], []
        self._window_started = time.perf_counter()
        if self.session.tracking is not None:
            self.session.tracking.log_metrics(values, step)
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
        data_s = self._data_wait.take()
        mine = torch.tensor([float(self.session.stop.wanted()), own, data_s], device=self.device)
        if self.env.distributed:
            if self._hosts is None:
                self._hosts = rank_hosts(self.world_size)
            rows_t = torch.empty(self.world_size * 3, device=self.device)
            dist_env.all_gather_flat(rows_t, mine)
            rows = rows_t.view(self.world_size, 3).tolist()
        else:
            rows = [mine.tolist()]
        self._step += 1
        if heartbeat is not None:
            heartbeat.beat(self._step + 1, "step")  # the next step has begun
        if self._synced_at is not None and self.is_main:
            # Each row: [stop wanted, own seconds, data seconds] of one rank.
            owns = self._own_sums or [0.0] * len(rows)
            waits = self._data_sums or [0.0] * len(rows)
            self._own_sums = [total + row[1] for total, row in zip(owns, rows, strict=True)]
            self._data_sums = [total + row[2] for total, row in zip(waits, rows, strict=True)]
            self._window_steps += 1
        self._synced_at = time.perf_counter()
        return any(row[0] > 0 for row in rows)

    def exit_for_requeue(self) -> NoReturn:
        """End this process so that the job goes on later from the last checkpoint:
        exit 75 (the batch script requeues the job) after a stop request, 143 after
        SIGTERM (SLURM requeues or ends the job itself). The MLflow run stays open
        for the next start. Save first (`checkpoint.save(step, wait=True)`)."""
        terminated = self.session.stop.terminated
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
        steps = self._window_steps
        own = [total / steps for total in self._own_sums]
        data = [total / steps for total in self._data_sums]
        compute = [max(o - d, 0.0) for o, d in zip(own, data, strict=True)]
        return Slowest.of(data, compute, self._hosts)

    def _start_at(self, step: int) -> None:
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
            self.session.announce(code)
        for checkpoint in self._checkpoints:
            checkpoint.close()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._progress is not None:
            self._progress.close()
        self.session.close(status)

    def _at_exit(self) -> None:
        """atexit: a script that ended without finish() or exit_for_requeue() still
        sends what it logged (the MLflow writer is a daemon thread) and lets a save in
        flight commit; the run's final state then comes from the job's end."""
        self._end(None, None)

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
        code = self.session.exit_code_for(exc, tb, err=err)
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
    # The collector paused while the config, the process group and the tracking store
    # (mlflow) come up; nothing frozen: the objects alive now are the loop's as well
    # (stoker/process/gc_pause.py).
    pause_collector()
    try:
        stop = StopRequest()
        stop.install()
        session = JobSession.start(Path(config) if config is not None else _config_path(), stop)
        run = Run(session)
        _current = run
        sys.excepthook = run._on_uncaught
        atexit.register(run._at_exit)
        session.join()
        # Again: init_process_group wraps the hook in one that buffers stderr until the
        # hook returns, and this one ends the process (its exit code) before that.
        sys.excepthook = run._on_uncaught
        train = session.config.train
        # The loop's mesh as before CP ("node": HSDP across nodes), CP groups within it.
        layout = training_mesh(
            session.env, session.device, "node", train.context_parallel, train.ulysses_degree()
        )
        run.mesh, run.cp = layout.fsdp, layout.cp
        set_context_parallel(layout.cp)
        tracking = session.open_tracking()
    finally:
        resume_collector(freeze=False)
    if session.env.is_main:  # the data sets the config names (the synthetic one: run.loader())
        record_data_sets(tracking, session.config.data, evaluates=True, synthetic=False)
    # The same seed on every rank: the same initial weights before sharding.
    torch.manual_seed(session.config.train.seed)
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
