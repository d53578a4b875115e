"""Heartbeats and the hang watchdog: a stalled rank fails the job in minutes,
with every rank's Python stack in its log, instead of holding the allocation
until a 30-minute collective timeout or the time limit.

    the loop:   heartbeat.beat(step, "forward")       two attribute writes
    a thread per rank, every interval:
                writes heartbeat/r<restart>/rank-<R>.json
                    {rank, host, pid, step, phase, progress_at, written_at}
                dumps its stacks (faulthandler, every thread; and `py-spy dump
                --native` when py-spy is installed: the C frames too) once the
                watchdog asks (the file `dump` appears), then exits the process
    global rank 0's thread, also:
                reads every rank's file; a rank whose progress is older than
                train.hang_timeout_s has stalled (one whose file is no longer
                written has gone: killed, or frozen whole)
                writes hang.json (which rank, phase, step, how long, every
                rank's phase), asks every rank to dump, dumps its own stacks,
                and exits EXIT_HANG: srun (--kill-on-bad-exit) or torchrun
                stop the others

The thread runs while the main thread is blocked in C (an NCCL or gloo
collective, a read): CPython lets go of the GIL there. That is why this is a
thread and the stacks come from faulthandler. The ranks waiting for a stalled
one stall too, in a collective: the step's flags all-reduce ("sync"), or
FSDP's all-gathers inside "forward" and "backward". So the culprit is a rank
that is gone, else the stalled rank outside "sync" whose progress is oldest:
the others reached their wait after it stopped.

`stoker why` reads hang.json and the culprit's stack from its log
(stoker/launcher/why/hang.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.protocol import EXIT_FILE, EXIT_HANG, HANG_FILE, HEARTBEAT_DIR, STACK_HEADER
from stoker.runtime.dist import flight_recorder

WARMUP_FACTOR = 3
"""A rank's first step in a process may take this many times train.hang_timeout_s before
it counts as stalled: its loader's workers start and fetch their first samples then
(measured: over 5 s on a loaded node, where the later steps took well under one)."""
COLLECTIVE_PHASE = "sync"
"""The phase where a rank waits for every other: not where a hang starts."""
DUMP_FILE = "dump"


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    pid: int
    step: int
    phase: str
    progress_at: float
    """Wall time of the last beat(): the rank's last progress."""
    written_at: float
    """Wall time this file was written: the thread is alive."""
    warming: bool = False
    """Still in the first step this process runs (DataLoader workers starting, the first
    fetches, compiles): judged against WARMUP_FACTOR x train.hang_timeout_s."""

    @classmethod
    def read(cls, path: Path) -> Beat | None:
        try:
            data = json.loads(path.read_text())
            data.setdefault("warming", False)  # written by an older stoker
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being replaced, or not written yet


def folder_for(run_dir: Path, restart: int) -> Path:
    return run_dir / HEARTBEAT_DIR / f"r{restart}"


def interval_for(timeout_s: float) -> float:
    """Seconds between two heartbeats of a rank watched with train.hang_timeout_s."""
    return max(0.5, min(5.0, timeout_s / 6))


def silent_ranks(
    run_dir: Path,
    restart: int,
    world_size: int,
    silent_s: float,
    now: float | None = None,
    *,
    among: Sequence[int] | None = None,
) -> list[int]:
    """The ranks (of `among`, default all) whose heartbeat thread has written nothing
    for `silent_s`: the whole process froze (stopped, stuck in the kernel) or died. Read
    by a rank whose collective timed out, to name the peer it waited on, and by one
    waiting for a save in flight (job_checkpointer.peers_gone_for)."""
    now = time.time() if now is None else now
    folder = folder_for(run_dir, restart)
    ranks = range(world_size) if among is None else among
    beats = (Beat.read(folder / f"rank-{rank}.json") for rank in ranks)
    return [b.rank for b in beats if b is not None and now - b.written_at > silent_s]


@dataclass(frozen=True)
class Stall:
    rank: int
    host: str
    phase: str
    step: int
    stalled_s: float
    gone: bool
    """No heartbeat written for that long: the process was killed or froze whole."""

    def describe(self, timeout_s: float) -> str:
        what = "stopped writing heartbeats (killed, or frozen)" if self.gone else "stalled"
        return (
            f"rank {self.rank} ({self.host}) {what} in phase '{self.phase}' at step "
            f"{self.step} for {self.stalled_s:.0f} s (train.hang_timeout_s={timeout_s:g})"
        )


def find_stall(beats: list[Beat], now: float, timeout_s: float) -> Stall | None:
    """The rank a hang starts at, if any rank has stalled for longer than timeout_s (in
    its first step, WARMUP_FACTOR x timeout_s)."""
    stalled = []
    for beat in beats:
        gone = now - beat.written_at > timeout_s
        since = now - (beat.written_at if gone else beat.progress_at)
        allowed = timeout_s * WARMUP_FACTOR if beat.warming else timeout_s
        if gone or since > allowed:
            stalled.append((gone, beat, since))
    if not stalled:
        return None
    # A gone rank first; then a stalled rank outside the collective; the oldest.
    stalled.sort(key=lambda s: (not s[0], s[1].phase == COLLECTIVE_PHASE, -s[2]))
    gone, beat, since = stalled[0]
    return Stall(beat.rank, beat.host, beat.phase, beat.step, since, gone)


class Heartbeat:
    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        restart: int,
        timeout_s: float,
        interval_s: float | None = None,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self.folder = folder_for(run_dir, restart)
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self.interval_s = interval_s or interval_for(timeout_s)
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self._exit = exit
        self.step, self.phase = 0, "start"
        self.progress_at = time.time()
        self._first_step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dumped = False

    def beat(self, step: int, phase: str) -> None:
        """Called by the loop at each phase; cheap enough for every micro-batch."""
        if self._first_step is None:
            self._first_step = step
        self.step, self.phase, self.progress_at = step, phase, time.time()

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._run, name="stoker-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s * 2)

    # --- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._write()
                if (self.folder / DUMP_FILE).exists():
                    self._dump_and_exit()
                if self.rank == 0:
                    self._watch()
            except OSError as exc:  # a full or flaky shared disk must not stop training
                print(f"stoker: heartbeat of rank {self.rank}: {exc}", file=sys.stderr, flush=True)

    def _write(self) -> None:
        warming = self._first_step is None or self.step == self._first_step
        beat = Beat(
            self.rank,
            self.host,
            os.getpid(),
            self.step,
            self.phase,
            self.progress_at,
            time.time(),
            warming,
        )
        path = self.folder / f"rank-{self.rank}.json"
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(json.dumps(beat.__dict__))
        temp.replace(path)

    def _beats(self) -> list[Beat]:
        beats = []
        for rank in range(self.world_size):
            beat = Beat.read(self.folder / f"rank-{rank}.json")
            if beat is not None:
                beats.append(beat)
        return beats

    def _watch(self) -> None:
        beats = self._beats()
        stall = find_stall(beats, time.time(), self.timeout_s)
        if stall is None:
            return
        message = stall.describe(self.timeout_s)
        report = {
            **stall.__dict__,
            "message": message,
            "timeout_s": self.timeout_s,
            "detected_at": time.time(),
            "ranks": {b.rank: {"phase": b.phase, "step": b.step, "host": b.host} for b in beats},
        }
        (self.folder / HANG_FILE).write_text(json.dumps(report, indent=1) + "\n")
        (self.folder / DUMP_FILE).touch()
        print(
            f"stoker: {message}: every rank dumps its Python stacks to its log; failing the job",
            file=sys.stderr,
            flush=True,
        )
        self._dump()
        # Wait for the others' dumps: once one exits, the rest fail in their
        # collectives (train.py then exits EXIT_HANG too, seeing hang.json).
        alive = [b.rank for b in beats if not (stall.gone and b.rank == stall.rank)]
        deadline = time.monotonic() + self.interval_s * 3 + 2
        while time.monotonic() < deadline and not all(
            (self.folder / f"dumped-{rank}").exists() for rank in alive
        ):
            time.sleep(0.2)
        self._exit(EXIT_HANG)

    def _dump_and_exit(self) -> None:
        self._dump()
        self._exit(EXIT_HANG)

    def _dump(self) -> None:
        if self._dumped:
            return
        self._dumped = True
        print(
            f"{STACK_HEADER} {self.rank} ({self.host}), phase '{self.phase}', step {self.step}:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        native = py_spy_dump(os.getpid())
        if native is not None:
            print(f"{PY_SPY_HEADER} {self.rank}:\n{native}", file=sys.stderr, flush=True)
        flight_recorder.dump(self.rank)  # the collectives each rank reached
        (self.folder / f"dumped-{self.rank}").touch()


PY_SPY_HEADER = "stoker: py-spy dump --native of rank"
PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, -1


def py_spy_dump(pid: int, timeout_s: float = 30.0) -> str | None:
    """`py-spy dump --native` of `pid` when py-spy is installed (beside this Python, or
    on PATH): every thread's Python and C frames, which faulthandler does not show (a
    rank stuck inside NCCL, CUDA or a read). None without py-spy."""
    beside = Path(sys.executable).with_name("py-spy")
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        return None
    if pid == os.getpid():
        # Yama (ptrace_scope=1) lets a process be traced by its ancestors only: allow
        # the py-spy child to attach to us. Only the hang dump does this, just before exit.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
    try:
        argv = [spy, "dump", "--native", "--pid", str(pid)]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc}"
    if result.returncode != 0:
        return f"py-spy failed (exit {result.returncode}): {result.stderr.strip()[-500:]}"
    return result.stdout


def hang_reported(run_dir: Path, restart: int) -> bool:
    """Whether the watchdog failed this attempt: a rank whose collective then
    breaks (a peer exited) exits EXIT_HANG, not as a crash of its own."""
    return (folder_for(run_dir, restart) / HANG_FILE).exists()


def announce_exit(
    run_dir: Path, restart: int, rank: int, code: int, silent: Sequence[int] = ()
) -> None:
    """Write `heartbeat/r<restart>/rank-<R>.exit.json` (EXIT_FILE): the exit code this
    rank decided on, before its slow way out. A rank that SLURM then kills (its step
    cancelled while it closed MLflow) is read by the batch script as exiting `code`,
    not as killed on a bad node. `silent`: with EXIT_PEER_LOST, the peers whose heartbeat
    had stopped while this rank waited for them ("silent_ranks"): SLURM kills such a
    frozen rank once the step ends, and that kill is no sign of a bad node either.
    Best effort: a full disk only loses that nuance."""
    path = folder_for(run_dir, restart) / EXIT_FILE.format(rank=rank)
    record: dict[str, Any] = {"exit_code": code, "written_at": int(time.time())}
    if silent:
        record["silent_ranks"] = sorted(silent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.tmp")
        temp.write_text(json.dumps(record))
        temp.replace(path)
    except OSError as exc:
        print(f"stoker: rank {rank}: could not write {path}: {exc}", file=sys.stderr, flush=True)
