"""One job's lifecycle on a rank: what the built-in trainer (train.py) and a loop of
one's own (`stoker.job`, own_loop/) both go through, written once.

    JobSession.start(path, stop)  the frozen config, this rank's place and device, CPU
                                  threads, the run folder, which start this is
    session.join()                the process group: every rank joined, or a named failure
    session.open_tracking()       the job's MLflow run (rank 0; the others a file sink)
    session.exit_code_for(exc)    an exception's exit code, said on stderr: 1 for an
                                  error of the job's own, 124 when the hang watchdog
                                  stopped it, 76 when a collective lost a peer
    session.announce(code)        the exit code said first, in rank-N.exit.json (the
                                  batch script reads it if SLURM kills the rank while
                                  it exits), with the peers that froze for a lost one
    session.close(status)         the MLflow run's state, the process group left, and a
                                  late stop signal ignored

and what both loops do around their batches: `data_url` (the synthetic set when the
config names no data), `check_batch_split`, `to_device` (dicts of tensors, such as
latents, included; `DeviceBatch` with its rows counted on the host) and `rank_hosts`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import torch

from stoker.config import DataConfig, ExperimentConfig, load_frozen
from stoker.errors import StokerError
from stoker.protocol import ENV_RESTART, ENV_RUN_DIR, EXIT_HANG, EXIT_PEER_LOST
from stoker.runtime.dist import dist_env, flight_recorder, rendezvous
from stoker.runtime.dist.dist_env import DistEnv, node_name
from stoker.runtime.observe.heartbeat import (
    announce_exit,
    hang_reported,
    interval_for,
    silent_ranks,
)
from stoker.runtime.observe.rank_tracking import Tracking, open_tracking
from stoker.runtime.stop_request import StopRequest

# Stay on the host: the trainer's noise_for reads them, and reading them back from a
# GPU would add a host sync to every micro-batch.
HOST_KEYS = frozenset({"position"})


@dataclass
class JobSession:
    """This rank's job: made by `start()`, one per process."""

    config: ExperimentConfig
    config_path: Path
    env: DistEnv
    device: torch.device
    run_dir: Path
    restart: int
    """0 on the job's first start, +1 per requeue or restart ($STOKER_RESTART)."""
    stop: StopRequest
    tracking: Tracking | None = None
    """The job's MLflow run, once `open_tracking()` opened it."""
    exit_code: int | None = field(default=None, init=False)
    """What `announce()` said."""
    marks: dict[str, float] = field(default_factory=dict, init=False)
    """When this rank reached each point of its start (epoch seconds): `process` (the
    process began), `session` (torch imported), `joined` (the rendezvous), `tracking`
    (its MLflow run open). The time account's start line keeps them."""

    @classmethod
    def start(cls, config_path: Path, stop: StopRequest) -> JobSession:
        """Where this rank stands, from the launcher's variables and the frozen config."""
        config = load_frozen(config_path)
        env = dist_env.detect()
        device = dist_env.device_for(env)
        if device.type == "cpu":
            torch.set_num_threads(dist_env.cpu_threads(env))
        run_dir = Path(os.environ.get(ENV_RUN_DIR) or config_path.resolve().parent)
        restart = int(os.environ.get(ENV_RESTART) or 0)
        session = cls(config, config_path, env, device, run_dir, restart, stop)
        session.marks.update(process=process_started_at(), session=time.time())
        return session

    def join(self) -> None:
        """The process group (rendezvous.py): every rank, or a StokerError naming the
        missing ones within train.rendezvous_timeout_s."""
        rendezvous.join(
            self.env,
            self.device,
            rendezvous_timeout_s=self.config.train.rendezvous_timeout_s,
            collective_timeout_s=self.config.train.collective_timeout_s,
        )
        self.marks["joined"] = time.time()

    def open_tracking(self) -> Tracking:
        self.tracking = open_tracking(
            self.config, self.env, self.device, self.run_dir, self.config_path
        )
        self.marks["tracking"] = time.time()
        return self.tracking

    # --- the end ---------------------------------------------------------------------

    def exit_code_for(
        self,
        exc: BaseException,
        tb: TracebackType | None = None,
        *,
        err: IO[str] | None = None,
    ) -> int:
        """The exit code of a start that ended on `exc`, said on `err` (stderr): the
        hang watchdog's report explains any failure after it (124); the job's own
        errors, stoker's and the kernels', read as a message and its fix (1); a
        collective that lost a peer is not this rank's bug (76: the batch script may
        start the job again, job.max_restarts); anything else shows its traceback (1)."""
        from stoker.kernels import KernelBackendError

        err = err or sys.stderr
        rank = self.env.rank
        if hang_reported(self.run_dir, self.restart):
            print(
                f"stoker: rank {rank}: stopped by the hang watchdog (heartbeat/…/hang.json)",
                file=err,
                flush=True,
            )
            return EXIT_HANG
        if isinstance(exc, StokerError | KernelBackendError):
            # The kernels know nothing of stoker; their user errors read the same.
            print(f"stoker: rank {rank}: {exc}", file=err, flush=True)
            return 1
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=err)
        if dist_env.lost_peer(exc):
            timeout_s = self.config.train.collective_timeout_s
            print(
                f"stoker: rank {rank}: a collective lost a peer (killed, frozen, or its "
                f"node lost; train.collective_timeout_s={timeout_s:g}); exit "
                f"{EXIT_PEER_LOST}",
                file=err,
                flush=True,
            )
            flight_recorder.dump(rank)
            return EXIT_PEER_LOST
        err.flush()
        return 1

    def announce(self, code: int) -> int:
        """Say this rank's exit code before the slow way out (MLflow, the process group):
        a rank SLURM kills while it exits is no sign of a bad node. Returns `code`."""
        self.exit_code = code
        peers = self.frozen_peers() if code == EXIT_PEER_LOST else []
        announce_exit(self.run_dir, self.restart, self.env.rank, code, peers)
        return code

    def frozen_peers(self) -> list[int]:
        """The other ranks whose heartbeat went silent. A peer killed outright ends the
        wait at once (srun, or the closed socket): silent for a heartbeat or two. One
        silent for half the collective's timeout froze while this rank waited on it."""
        train = self.config.train
        if not train.hang_timeout_s:
            return []  # no heartbeats
        silent_s = max(train.collective_timeout_s / 2, 3 * interval_for(train.hang_timeout_s))
        found = silent_ranks(self.run_dir, self.restart, self.env.world_size, silent_s)
        return [rank for rank in found if rank != self.env.rank]

    def close(self, status: str | None) -> None:
        """End the MLflow run `status` (None: it stays open for the next start, or the
        job's end decides), leave the process group (not after a lost peer: leaving
        would wait on it), and ignore a stop signal from here on: Python's exit restores
        SIGUSR2's default action, which would kill a rank that has finished while a
        stop comes, and fail the job."""
        if self.tracking is not None:
            self.tracking.close(status)
        if self.exit_code != EXIT_PEER_LOST and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def process_started_at() -> float:
    """When this process began (epoch seconds): Linux's /proc, else now."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # starttime: clock ticks after boot
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def data_url(data: DataConfig, *, say: Callable[[str], Any] | None = None) -> str | None:
    """data.url, or with neither data.url nor data.sources the synthetic audio-video set,
    made on first use (`say`: its progress, on one rank)."""
    if data.url is not None or data.sources:
        return data.url
    from stoker.data.synthetic.default_set import ensure_synthetic_data

    return str(ensure_synthetic_data(data, progress=say))


def rank_hosts(world_size: int) -> list[str]:
    """Every rank's node, by rank: an all_gather_object, so every rank calls it."""
    hosts: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(hosts, node_name())
    return [str(host) for host in hosts]


def check_batch_split(data: DataConfig, world_size: int, grad_accum: int = 1) -> None:
    """data.batch_size must split into `grad_accum` micro-batches on every rank (with
    buckets, each bucket's batch is checked where the loader splits it)."""
    parts = grad_accum * world_size
    if data.buckets or data.batch_size % parts == 0:
        return
    into = f"into train.grad_accum {grad_accum} micro-batches " if grad_accum > 1 else ""
    raise StokerError(
        f"data.batch_size {data.batch_size} does not split {into}over {world_size} ranks",
        fix=f"use a data.batch_size that is a multiple of {parts}",
    )


def to_device(
    batch: dict[str, Any], device: torch.device, host_keys: Iterable[str] = HOST_KEYS
) -> dict[str, Any]:
    """A loader batch on `device`: its tensors, and dicts of tensors (latents, a
    .safetensors member), copied without waiting; `host_keys` and anything else as
    they are."""
    stay = frozenset(host_keys)

    def moved(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device, non_blocking=True)
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(v, torch.Tensor) for v in value.values())
        ):
            return {k: v.to(device, non_blocking=True) for k, v in value.items()}
        return value

    return {k: v if k in stay else moved(v) for k, v in batch.items()}


class DeviceBatch(dict[str, Any]):
    """A loader batch on the device, with its rows counted on the host before the copy
    (reading `valid` back from the device would sync)."""

    rows: int
    valid_rows: int
    """Rows whose `valid` is True; the others stand in for samples the loader skipped."""
    skipped: int
    """Samples the loader skipped in this batch (its `skipped` list)."""

    @classmethod
    def of(cls, batch: dict[str, Any], device: torch.device) -> DeviceBatch:
        out = cls(to_device(batch, device))
        out.rows = len(batch["position"])
        out.valid_rows = int(batch["valid"].sum()) if "valid" in batch else out.rows
        out.skipped = len(batch.get("skipped", ()))
        return out
