"""Sharded saves and loads of the training state, on every rank.

    save(step)   blocking part: the state dict is staged (copied off the
                 training tensors: to pinned host memory on GPUs), then the
                 rank goes back to training
                 background, one job per save, in the same order on every rank:
                   DCP writes this rank's shards (the coordinator .metadata last)
                   each rank's sha256 of the files it wrote (hashed as written
                     locally, read back from object stores); gathered to the coordinator
                   the coordinator writes COMMIT.json, verifies it, applies the
                   retention rules and reports the save (metrics, MLflow)
    load_latest  the newest checkpoint that verifies (falling back with a
                 warning past broken ones), resharded onto this world size

Checkpoint collectives run on their own gloo group, never the training one:
a background save's collectives interleaved with the training loop's on one
group deadlock (different ranks issue them in different orders). For the same
reason one save is in flight at a time: two background jobs on one group
would interleave theirs. A save that finds the previous one still running
waits for it, and that wait counts as blocking time.

That group keeps a long timeout (CHECKPOINT_GROUP_TIMEOUT): a rank that finished
writing waits in the last gather for one still uploading its shards, which may
take minutes. A peer that froze or died instead is told apart by its heartbeat
(`peers_gone`): the wait for a save in flight ends with PeerGone once a peer has
been silent for the collective timeout, as a training collective would.

Saves run in a thread, not DCP's process-based saver: with torch 2.13 on gloo
the checkpoint process failed to set up its group ("trying to initialize the
default process group twice"); the thread only waits on I/O and gloo, and
staging is done before it starts, so it does not hold the GIL for long.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stoker.checkpoint import commit as ck
from stoker.checkpoint import retention
from stoker.checkpoint.storage import storage_reader, storage_writer, written_digests
from stoker.checkpoint.train_state import (
    Extra,
    TrainState,
    apply_loaded,
    state_to_load,
    state_to_save,
)
from stoker.errors import StokerError
from stoker.metric_names import checkpoint_metrics

CHECKPOINT_GROUP_TIMEOUT = datetime.timedelta(minutes=30)
"""The checkpoint group's collectives' timeout: a save's slowest rank (module doc)."""


class PeerGone(torch.distributed.DistError):
    """A peer went silent (killed, frozen, its node lost) while this rank waited for
    its part of a save: a lost peer, as a collective that timed out on it would say
    (exit 76, restartable: runtime/session.py)."""


@dataclass(frozen=True)
class SaveRecord:
    """One committed save, as the coordinator reports it."""

    step: int
    url: str
    bytes: int
    blocking_s: float
    """Seconds the training loop was held (waiting for the previous save included)."""
    background_s: float
    """Seconds from the end of the blocking part to the commit."""

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / max(self.blocking_s + self.background_s, 1e-9)


def save_metrics(record: SaveRecord) -> dict[str, float]:
    """The per-save metrics, as logged at the save's step."""
    return checkpoint_metrics(record.bytes, record.blocking_s, record.background_s)


@dataclass
class _InFlight:
    step: int
    url: str
    job: Future[SaveRecord | None]


def _warn(message: str) -> None:
    print(f"stoker: warning: {message}", file=sys.stderr, flush=True)


def _quiet_single_process() -> None:
    """DCP warns on every save and load without a process group ("assuming the
    intent is to save in a single process"), from the save thread too, where a
    catch_warnings() of the caller does not reach: one process is what is meant."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")


class Checkpointer:
    """Saves and loads under one root URL; create it on every rank (a collective
    when torch.distributed is initialized: it makes the checkpoint group)."""

    def __init__(
        self,
        root_url: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        async_save: bool = True,
        keep_last: int = 3,
        keep_every: int | None = None,
        mesh: dict[str, Any] | None = None,
        state_hash: str | None = None,
        fs_options: dict[str, Any] | None = None,
        full_verify_on_load: bool = False,
        on_commit: Callable[[SaveRecord], None] | None = None,
        start_fresh_if_none_verifies: bool = False,
        described_by: str | None = None,
        facts: dict[str, Any] | None = None,
        carried: Callable[[], dict[str, str]] | None = None,
        peers_gone: Callable[[], list[int]] | None = None,
        peers_poll_s: float = 5.0,
    ) -> None:
        self.root = root_url.rstrip("/")
        # `peers_gone()`: the ranks silent past the collective timeout (their heartbeats),
        # asked every `peers_poll_s` while a save in flight is waited for.
        self.peers_gone, self.peers_poll_s = peers_gone, peers_poll_s
        # What makes each commit usable alone (no run folder): the frozen experiment
        # (ck.CONFIG_NAME) and COMMIT.json's `extra` facts (the data's shapes, the store).
        # `carried()`: small files read at each commit, as they are then (the steps the
        # run measured so far, ck.MEASURED_NAME).
        self.described_by, self.facts = described_by, dict(facts or {})
        self.carried = carried
        self.rank, self.world_size = rank, world_size
        self.is_coordinator = rank == 0
        self.async_save = async_save
        self.keep_last, self.keep_every = keep_last, keep_every
        self.mesh, self.state_hash = mesh, state_hash
        self.fs_options = fs_options
        self.full_verify_on_load = full_verify_on_load
        self.start_fresh_if_none_verifies = start_fresh_if_none_verifies
        self.on_commit = on_commit
        self.distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.group: Any = (
            torch.distributed.new_group(backend="gloo", timeout=CHECKPOINT_GROUP_TIMEOUT)
            if self.distributed
            else None
        )
        if not self.distributed:
            _quiet_single_process()
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stoker-checkpoint")
        self._in_flight: _InFlight | None = None
        self._stager: Any = None
        self._loaded_step: int | None = None
        self._lock = threading.Lock()
        self.records: list[SaveRecord] = []
        """Committed saves of this process (coordinator only), oldest first."""
        self.failures: list[tuple[int, str]] = []

    # --- save ------------------------------------------------------------------------

    def url_for(self, step: int) -> str:
        return f"{self.root}/step-{step}"

    def save(
        self,
        step: int,
        state: TrainState,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        *,
        extra: Extra | None = None,
    ) -> float:
        """Save the state at `step` (a collective); returns the blocking seconds.
        With async_save the files are written in the background: wait() for them.
        `extra`: state dicts saved beside the model (train_state.py), e.g. the EMA."""
        if step == self._loaded_step:
            return 0.0  # just resumed from this very checkpoint: nothing new to save
        started = time.perf_counter()
        self._wait_in_flight()
        url = self.url_for(step)
        refusal: list[str | None] = [self._mark(url, step) if self.is_coordinator else None]
        # Also: no rank creates the folder before the coordinator has cleared it.
        self._broadcast(refusal)
        if refusal[0] is not None:
            fix = "move that folder out of the checkpoint root, or set checkpoint.root elsewhere"
            raise StokerError(refusal[0], fix=fix)
        state_dict = state_to_save(state, model, optimizer, scheduler, rank=self.rank, extra=extra)
        writer = storage_writer(url, self.fs_options)
        if self.async_save:
            from torch.distributed.checkpoint.state_dict_saver import async_save

            upload = async_save(
                state_dict,
                storage_writer=writer,
                process_group=self.group,
                async_stager=self._get_stager(),
                no_dist=not self.distributed,
            )
            blocking = time.perf_counter() - started
            job = self._jobs.submit(self._finish, step, url, writer, upload, blocking)
            self._in_flight = _InFlight(step, url, job)
            return blocking
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        dcp_save(
            state_dict,
            storage_writer=writer,
            process_group=self.group,
            no_dist=not self.distributed,
        )
        done: Future[None] = Future()
        done.set_result(None)
        self._finish(step, url, writer, done, 0.0, sync_started=started)
        return time.perf_counter() - started

    def _get_stager(self) -> Any:
        """Staging into reused host buffers (pinned on GPUs, so the copy runs at
        full PCIe speed); done synchronously, before the training step goes on."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    # Blocking copies: the write thread starts on the staged dict at
                    # once, and must never read a pinned buffer still being filled.
                    use_non_blocking_copy=False,
                )
            )
        return self._stager

    def _mark(self, url: str, step: int) -> str | None:
        """The start marker: the folder is stoker's (retention may delete it if it
        never commits). A folder already there for this step is one the last
        start did not resume from (cut short, or broken: newest_verified passed
        it by), so it goes first: shards written over an old COMMIT.json could
        pass a quick verification."""
        fs, folder = ck._open(url, self.fs_options)
        if ck.exists(url, fs_options=self.fs_options):
            if not retention.is_stokers(url, fs_options=self.fs_options):
                return f"cannot save step {step}: {url} exists and stoker did not write it"
            ck.remove(url, fs_options=self.fs_options)
        fs.makedirs(folder, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        marker = json.dumps({"step": step, "started": stamp}) + "\n"
        fs.pipe_file(f"{folder}/{retention.MARKER_NAME}", marker.encode())
        return None

    def _finish(
        self,
        step: int,
        url: str,
        writer: Any,
        upload: Any,
        blocking_s: float,
        *,
        sync_started: float | None = None,
    ) -> SaveRecord | None:
        """The background job: every rank in the same order (collectives)."""
        began = time.perf_counter()
        failure: str | None = None
        known: dict[str, tuple[int, str]] = {}
        try:
            upload.result()
            mine = [
                n
                for n in ck.file_names(url, fs_options=self.fs_options)
                if n.startswith(f"__{self.rank}_")
            ]
            hashed = written_digests(writer)  # hashed while written (local writer)
            known = {n: hashed[n] for n in mine if n in hashed}
            rest = [n for n in mine if n not in known]
            known.update(ck.hash_files(url, rest, fs_options=self.fs_options))
        except Exception as exc:  # the save failed on this rank: no commit anywhere
            failure = f"{type(exc).__name__}: {exc}"
        gathered: list[Any] = [None] * self.world_size
        if self.distributed:
            torch.distributed.all_gather_object(gathered, (failure, known), group=self.group)
        else:
            gathered = [(failure, known)]
        failures = [f"rank {r}: {f}" for r, (f, _) in enumerate(gathered) if f]
        if failures:
            message = f"checkpoint step-{step} was not saved: {failures[0]}"
            self.failures.append((step, message))
            if self.is_coordinator:
                _warn(message + " (the next start resumes from the one before)")
            return None
        if not self.is_coordinator:
            return None
        for _, rank_known in gathered:
            known.update(rank_known)
        try:
            ck.write_commit(
                url,
                step=step,
                world_size=self.world_size,
                mesh=self.mesh,
                state_hash=self.state_hash,
                known=known,
                fs_options=self.fs_options,
                texts=self._texts(),
                extra=self.facts,
            )
            problems = ck.verify(url, full=False, fs_options=self.fs_options)
            if problems:
                raise StokerError(f"{url} does not verify right after its commit: {problems[0]}")
        except Exception as exc:
            message = f"checkpoint step-{step} was not committed: {exc}"
            self.failures.append((step, message))
            _warn(message)
            return None
        now = time.perf_counter()
        if sync_started is not None:
            blocking_s, background_s = now - sync_started, 0.0
        else:
            background_s = now - began
        size = ck.read_commit(url, fs_options=self.fs_options)
        record = SaveRecord(step, url, size.bytes if size else 0, blocking_s, background_s)
        with self._lock:
            self.records.append(record)
        self._apply_retention()
        if self.on_commit is not None:
            try:
                self.on_commit(record)
            except Exception as exc:  # reporting must not fail a committed save
                _warn(f"reporting checkpoint step-{step}: {type(exc).__name__}: {exc}")
        return record

    def _texts(self) -> dict[str, str] | None:
        """The small files a commit carries: the frozen experiment, then what
        `carried()` gives now; a `carried` that fails costs its files, not the commit."""
        texts = {ck.CONFIG_NAME: self.described_by} if self.described_by else {}
        if self.carried is not None:
            try:
                texts.update(self.carried())
            except Exception as exc:
                _warn(f"this commit carries only its config, not what carried() reads: {exc}")
        return texts or None

    def _apply_retention(self) -> None:
        try:
            decisions = retention.prune(
                self.root,
                keep_last=self.keep_last,
                keep_every=self.keep_every,
                fs_options=self.fs_options,
            )
        except Exception as exc:  # deleting old checkpoints can wait for the next save
            _warn(f"checkpoint retention under {self.root}: {type(exc).__name__}: {exc}")
            return
        for decision in decisions:
            if decision.delete:
                print(
                    f"deleted checkpoint step-{decision.row.step} ({decision.reason})", flush=True
                )

    def _wait_in_flight(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        if self.peers_gone is None:
            in_flight.job.result()
            return
        while True:
            try:
                in_flight.job.result(timeout=self.peers_poll_s)
                return
            except concurrent.futures.TimeoutError:
                gone = self.peers_gone()
            if gone:
                names = ", ".join(str(rank) for rank in gone)
                raise PeerGone(
                    f"rank {names} went silent (no heartbeat: killed, frozen, or its node "
                    f"lost) while rank {self.rank} waited for checkpoint "
                    f"step-{in_flight.step} to finish"
                )

    def wait(self) -> None:
        """Until the save in flight has committed (or failed) on every rank."""
        self._wait_in_flight()

    def close(self) -> None:
        self.wait()
        self._jobs.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    # --- load ------------------------------------------------------------------------

    def _newest(self) -> tuple[int, str] | None:
        """The newest checkpoint that verifies, decided on every rank together:
        the coordinator lists and checks sizes (one listing), then with full
        verification every rank hashes its share of the files, so a resume
        reads each byte once over all ranks, not the whole checkpoint on one."""
        rows: list[Any] = [None]
        if self.is_coordinator:
            rows[0] = ck.list_checkpoints(self.root, fs_options=self.fs_options)
        self._broadcast(rows)

        def check(row: ck.Row) -> list[ck.Problem]:
            # [problems, the commit's files]: the coordinator's quick check first.
            quick: list[Any] = [None, None]
            if self.is_coordinator:
                quick[0] = ck.verify(row.path, full=False, fs_options=self.fs_options)
                commit = None if quick[0] else ck.read_commit(row.path, fs_options=self.fs_options)
                quick[1] = list(commit.files) if commit else []
            self._broadcast(quick)
            if quick[0] or not self.full_verify_on_load:
                return list(quick[0])
            share = quick[1][self.rank :: self.world_size]
            found = ck.check_files(row.path, share, fs_options=self.fs_options)
            everyone: list[Any] = [found]
            if self.distributed:
                everyone = [None] * self.world_size
                torch.distributed.all_gather_object(everyone, found, group=self.group)
            return [p for problems in everyone for p in problems]

        said: list[str] = []  # the same on every rank: the problems are broadcast

        def warn(message: str) -> None:
            said.append(message)
            if self.is_coordinator:
                _warn(message)

        row = ck.first_good(rows[0], check, warn)
        if row is None:
            committed = [r for r in rows[0] if r.committed]
            if not committed:
                return None  # nothing saved yet (or only saves cut short): a fresh start
            if self.start_fresh_if_none_verifies:
                if self.is_coordinator:
                    _warn("starting from step 0 (checkpoint.if_none_verifies=start_fresh)")
                return None
            # Every rank raises the same error: the job stops, no step is retrained.
            raise StokerError(
                f"{len(committed)} committed checkpoint(s) under {self.root}, none verifies: "
                + "; ".join(m.removeprefix("no checkpoint verifies: ") for m in said),
                fix=f"see `stoker ckpt verify {self.root}`; restore the files, delete "
                "the broken step folders, or set checkpoint.if_none_verifies=start_fresh to "
                "train from step 0",
            )
        if self.is_coordinator:
            self._clear_abandoned(row.step)
        if self.distributed:
            torch.distributed.barrier(group=self.group)
        return row.step, row.path

    def _broadcast(self, objects: list[Any]) -> None:
        if self.distributed:
            torch.distributed.broadcast_object_list(objects, src=0, group=self.group)

    def _clear_abandoned(self, resumed: int) -> None:
        """Stoker's uncommitted folders newer than the resumed step: saves of an
        attempt that died (this run's, as no other job writes this root)."""
        for row in ck.list_checkpoints(self.root, fs_options=self.fs_options):
            if (
                row.step > resumed
                and not row.committed
                and retention.is_stokers(row.path, fs_options=self.fs_options)
            ):
                ck.remove(row.path, fs_options=self.fs_options)

    def load_latest(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        *,
        extra: Extra | None = None,
    ) -> TrainState | None:
        """Load the newest verified checkpoint into the model, optimizer and schedule
        (resharded onto this world size), and each `extra` state dict it has (in place:
        the state's `extra_loaded` names them); None when there is none."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        found = self._newest()
        if found is None:
            return None
        step, url = found
        reader = storage_reader(url, self.fs_options)
        metadata = reader.read_metadata()
        saved = metadata.state_dict_metadata
        rng_sizes = {
            k: v.size
            for k, v in saved.items()
            if k.startswith("rng.") and isinstance(v, TensorStorageMetadata)
        }
        state = state_to_load(model, optimizer, set(saved), rng_sizes, rank=self.rank, extra=extra)
        dcp_load(
            state,
            storage_reader=storage_reader(url, self.fs_options),
            process_group=self.group,
            no_dist=not self.distributed,
        )
        loaded = apply_loaded(state, model, optimizer, scheduler)
        if loaded.step != step:
            raise StokerError(
                f"{url} holds the state of step {loaded.step}, not {step}",
                fix="the folder was renamed or copied over: move it back, or delete it",
            )
        self._loaded_step = step
        return loaded
