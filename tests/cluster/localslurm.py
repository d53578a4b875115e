#!/usr/bin/env python3
"""A real SLURM 22.05 cluster on this one machine, for tests.

Runs munged, MariaDB, slurmdbd, slurmctld and three slurmd (nodes ``n1``,
``n2`` and ``n3``, 2 CPUs and 4 fake GPUs each) entirely from one state folder: keys,
configs, databases, sockets, pid files and logs all live there, so nothing in
/etc/munge, /etc/slurm or /run/mysqld is used and a second cluster can run
beside it on other ports.

    python tests/cluster/localslurm.py install   # apt-get the packages if missing
    python tests/cluster/localslurm.py start     # idempotent
    python tests/cluster/localslurm.py status    # exit 0 when healthy
    eval "$(python tests/cluster/localslurm.py env)"
    python tests/cluster/localslurm.py stop [--purge]

Standard library only, so it runs with any Python >= 3.10 (and before the
project's own dependencies are installed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

STATE_DIR_ENV = "STOKER_TEST_SLURM_DIR"
BASE_PORT_ENV = "STOKER_TEST_SLURM_BASE_PORT"
DEFAULT_STATE_DIR = "/tmp/stoker-slurm"
DEFAULT_BASE_PORT = 17100

CLUSTER_NAME = "stoker"
PARTITION = "debug"
# Three nodes: a 2-node job that loses one can start again without it (tests/faults).
NODE_NAMES = ("n1", "n2", "n3")
CPUS_PER_NODE = 2
GPUS_PER_NODE = 4
CRED_EXPIRE_S = 10
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"

APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
# Each entry is satisfied by any one of its names (MariaDB renamed its binaries).
REQUIRED_PROGRAMS: tuple[tuple[str, ...], ...] = (
    ("slurmctld",),
    ("slurmd",),
    ("slurmdbd",),
    ("sbatch",),
    ("munged",),
    ("mariadbd", "mysqld"),
)

# Every daemon we start carries this variable in its environment. /proc/PID/environ
# then tells our processes (and the slurmstepd they fork) from anybody else's,
# also after a pid has been reused.
TAG_ENV = "STOKER_LOCALSLURM_STATE"

# Node states in which a node can take jobs.
USABLE_NODE_STATES = {
    "idle",
    "mix",
    "mixed",
    "alloc",
    "allocated",
    "comp",
    "completing",
    "plnd",
    "planned",  # the backfill scheduler has planned a job for it
}


class ClusterError(RuntimeError):
    """The cluster could not be installed, started or stopped; the message says why."""


@dataclass
class Node:
    name: str
    addr: str
    hostname: str
    port: int


@dataclass
class ClusterSettings:
    """What tests need to know about a running cluster (saved as ``cluster.json``)."""

    state_dir: str
    slurm_conf: str
    cluster_name: str
    partition: str
    nodes: list[Node]
    gpus_per_node: int
    cpus_per_node: int
    mem_per_node_mb: int
    base_port: int
    ports: dict[str, int]
    pids: dict[str, int]
    log_dir: str
    munge_socket: str
    env: dict[str, str]
    # Fake GPUs are character devices, so jobs get CUDA_VISIBLE_DEVICES (see _make_fake_gpu).
    gpus_are_devices: bool
    # True when describing a cluster this module did not start (see describe_external).
    external: bool = False

    @property
    def node_names(self) -> list[str]:
        return [node.name for node in self.nodes]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterSettings:
        data = json.loads(text)
        data["nodes"] = [Node(**node) for node in data["nodes"]]
        return cls(**data)


# --------------------------------------------------------------------------- paths


class _Paths:
    """Where everything lives inside the state folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc"
        self.log = root / "log"
        self.run = root / "run"  # pid files
        self.munge = root / "munge"
        self.munge_socket = self.munge / "munge.socket"
        self.munge_key = self.munge / "munge.key"
        self.db = root / "db"
        self.db_data = self.db / "data"
        self.db_socket = self.db / "mysqld.sock"
        self.db_password = self.etc / "db-password"
        self.slurm_conf = self.etc / "slurm.conf"
        # slurmd finds gres.conf, and slurmdbd (which has no -f) slurmdbd.conf,
        # next to the slurm.conf named by -f / $SLURM_CONF.
        self.gres_conf = self.etc / "gres.conf"
        self.slurmdbd_conf = self.etc / "slurmdbd.conf"
        self.ctld_state = root / "ctld"
        self.spool = root / "spool"
        self.gpus = root / "gpus"
        self.settings = root / "cluster.json"
        self.lock = root / ".lock"

    def pid_file(self, daemon: str) -> Path:
        # Written by us right after spawning; the daemons' own pid files are *.daemon.pid.
        return self.run / f"{daemon}.pid"

    def stdout_log(self, daemon: str) -> Path:
        return self.log / f"{daemon}.out"


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def _paths(state_dir: str | os.PathLike[str] | None) -> _Paths:
    root = Path(state_dir) if state_dir is not None else default_state_dir()
    return _Paths(root.expanduser().resolve())


def _ports(base_port: int) -> dict[str, int]:
    ports = {"slurmctld": base_port, "slurmdbd": base_port + 1, "mariadb": base_port + 2}
    for index, name in enumerate(NODE_NAMES):
        ports[f"slurmd-{name}"] = base_port + 3 + index
    return ports


# ------------------------------------------------------------------------- install


def _which(program: str) -> str | None:
    # Daemons live in /usr/sbin, which a non-login PATH may lack.
    path = os.environ.get("PATH", os.defpath) + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which(program, path=path)


def _need(*names: str) -> str:
    for name in names:
        found = _which(name)
        if found:
            return found
    raise ClusterError(
        f"program {' or '.join(names)} not found; run "
        f"`python {Path(__file__).as_posix()} install` (apt-get: {' '.join(APT_PACKAGES)})"
    )


def missing_programs() -> list[str]:
    return [names[0] for names in REQUIRED_PROGRAMS if not any(_which(n) for n in names)]


def install(*, verbose: bool = True) -> None:
    """apt-get the SLURM, munge and MariaDB packages unless all programs are there."""
    missing = missing_programs()
    if not missing:
        _say(verbose, "slurm, munge and mariadb are installed")
        return
    _say(verbose, f"missing {', '.join(missing)}: installing {' '.join(APT_PACKAGES)}")
    apt = _which("apt-get")
    if apt is None:
        raise ClusterError(f"missing {', '.join(missing)} and no apt-get to install them")
    if os.geteuid() != 0:
        raise ClusterError(f"missing {', '.join(missing)}; installing them needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    commands = [
        [apt, "update"],
        [apt, "install", "-y", "--no-install-recommends", *APT_PACKAGES],
    ]
    for command in commands:
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(
                f"`{shlex.join(command)}` failed ({result.returncode}):\n"
                + _tail_text(result.stdout + result.stderr)
            )
    still_missing = missing_programs()
    if still_missing:
        raise ClusterError(f"still missing after apt-get install: {', '.join(still_missing)}")


# ------------------------------------------------------------------------ processes


def _say(verbose: bool, message: str) -> None:
    if verbose:
        print(f"localslurm: {message}", file=sys.stderr, flush=True)


def _tail_text(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return _tail_text(path.read_text(errors="replace"), lines)
    except OSError:
        return f"({path} not readable)"


def _pid_alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    # A zombie (Z) has exited; its parent (init, for our daemons) just has not reaped it yet.
    return fields[0] != "Z"


def _proc_is_ours(pid: int, program: str, state_dir: Path) -> bool:
    """True if pid is alive, runs `program` and carries our state-folder tag."""
    if not _pid_alive(pid):
        return False
    proc = Path(f"/proc/{pid}")
    try:
        argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        environ = (proc / "environ").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    # argv0 may be "slurmstepd: [12.batch]" (renamed by the program itself).
    if Path(argv0.split(":")[0]).name != program:
        return False
    return f"{TAG_ENV}={state_dir}".encode() in environ


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class _Daemon:
    name: str  # slurmd-n1, ...
    program: str  # the executable's base name, checked in /proc/PID/cmdline
    argv: list[str]


def _daemons(paths: _Paths, ports: Mapping[str, int]) -> list[_Daemon]:
    """All daemons in start order; all run in the foreground so their pid is the one we spawn."""
    conf = str(paths.slurm_conf)
    mariadbd = _need("mariadbd", "mysqld")
    daemons = [
        _Daemon(
            "munged",
            "munged",
            [
                _need("munged"),
                "--foreground",
                f"--socket={paths.munge_socket}",
                f"--key-file={paths.munge_key}",
                f"--pid-file={paths.run / 'munged.daemon.pid'}",
                f"--seed-file={paths.munge / 'munged.seed'}",
            ],
        ),
        _Daemon(
            "mariadb", Path(mariadbd).name, [mariadbd, *_mariadb_args(paths, ports["mariadb"])]
        ),
        _Daemon("slurmdbd", "slurmdbd", [_need("slurmdbd"), "-D"]),
        _Daemon("slurmctld", "slurmctld", [_need("slurmctld"), "-D", "-f", conf]),
    ]
    daemons += [
        _Daemon(f"slurmd-{node}", "slurmd", [_need("slurmd"), "-D", "-N", node, "-f", conf])
        for node in NODE_NAMES
    ]
    return daemons


def _mariadb_args(paths: _Paths, port: int) -> list[str]:
    return [
        "--no-defaults",  # must come first: ignore /etc/mysql entirely
        f"--datadir={paths.db_data}",
        f"--socket={paths.db_socket}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--pid-file={paths.run / 'mariadb.daemon.pid'}",
        "--user=root",  # mariadbd refuses to run as root unless told so
        "--skip-name-resolve",
        # Values slurmdbd checks at start (it logs an error below them).
        "--innodb-buffer-pool-size=1G",  # allocated lazily: RSS stays ~120 MB
        "--innodb-log-file-size=64M",
        "--innodb-lock-wait-timeout=900",
        # A throw-away test database need not fsync every commit.
        "--innodb-flush-log-at-trx-commit=2",
    ]


def _daemon_env(paths: _Paths) -> dict[str, str]:
    # Drop SLURM_* of any surrounding job so it cannot leak into our daemons.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(paths.slurm_conf)
    env[TAG_ENV] = str(paths.root)
    return env


def _client_env(paths: _Paths) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(paths.slurm_conf)
    return env


def _spawn(paths: _Paths, daemon: _Daemon) -> int:
    """Start a daemon detached from us and record its pid."""
    log = paths.stdout_log(daemon.name)
    # `sh` backgrounds the daemon and exits at once, so the daemon is re-parented
    # to init (no zombie or ResourceWarning in a long pytest process) and its own
    # session keeps a Ctrl-C in our terminal from reaching it.
    script = '"$@" </dev/null >>"$0" 2>&1 & echo $!'
    result = subprocess.run(
        ["/bin/sh", "-c", script, str(log), *daemon.argv],
        env=_daemon_env(paths),
        cwd=paths.root,
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    )
    pid = int(result.stdout.strip())
    paths.pid_file(daemon.name).write_text(f"{pid}\n")
    return pid


def _running_pid(paths: _Paths, daemon: _Daemon) -> int | None:
    pid = _read_pid(paths.pid_file(daemon.name))
    if pid is not None and _proc_is_ours(pid, daemon.program, paths.root):
        return pid
    return None


def _terminate(pids: Mapping[int, str], paths: _Paths, timeout: float) -> bool:
    """SIGTERM pids ({pid: program}, each checked to be ours), SIGKILL those left after timeout.

    Returns True if any needed SIGKILL.
    """
    alive = {pid: prog for pid, prog in pids.items() if _proc_is_ours(pid, prog, paths.root)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {pid: prog for pid, prog in alive.items() if _proc_is_ours(pid, prog, paths.root)}
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return bool(alive)


def _our_stepds(paths: _Paths) -> dict[int, str]:
    """slurmstepd processes forked by our slurmd (they inherit its environment tag)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _proc_is_ours(int(entry.name), "slurmstepd", paths.root):
            found[int(entry.name)] = "slurmstepd"
    return found


def _kill_descendants(roots: Iterable[int]) -> list[int]:
    """SIGKILL all processes below roots (a job's tasks below its slurmstepd), as slurmd would."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    pending = list(roots)
    while pending:
        kids = children.get(pending.pop(), [])
        found += kids
        pending += kids
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return sorted(found)


# -------------------------------------------------------------------------- waiting


def _wait_until(
    what: str, check: Callable[[], bool], timeout: float, log: Path, pid: int | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if pid is not None and not _pid_alive(pid):
            raise ClusterError(f"{what}: the process died; see {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready after {timeout:.0f} s; see {log}:\n{_tail(log)}")
        time.sleep(0.2)


def _run(
    argv: Sequence[str], env: Mapping[str, str], timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(list(argv), 124, "", f"timed out: {exc}")


def _ok(argv: Sequence[str], env: Mapping[str, str], timeout: float = 10) -> bool:
    return _run(argv, env, timeout).returncode == 0


# --------------------------------------------------------------------------- config


def _hostname() -> str:
    # slurmctld compares SlurmctldHost with the short host name.
    return socket.gethostname().split(".")[0]


def _mem_per_node_mb() -> int:
    # The fake nodes share this machine; give each an honest share of its memory.
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 // len(NODE_NAMES)
    return 1024


def _slurm_conf(paths: _Paths, ports: Mapping[str, int], mem_mb: int) -> str:
    host = _hostname()
    # cred_expire is also how long a requeued job waits before it may start again
    # (120 s by default): short here so requeue tests take seconds, not minutes.
    munge = f"socket={paths.munge_socket},cred_expire={CRED_EXPIRE_S}"
    lines = [
        "# Written by tests/cluster/localslurm.py; regenerated on every start.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports['slurmctld']}",
        "AuthType=auth/munge",
        f"AuthInfo={munge}",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={paths.ctld_state}",
        # %n: one spool folder, pid file and log per emulated node.
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.run}/slurmctld.daemon.pid",
        f"SlurmdPidFile={paths.run}/slurmd-%n.daemon.pid",
        f"SlurmctldLogFile={paths.log}/slurmctld.log",
        f"SlurmdLogFile={paths.log}/slurmd-%n.log",
        f"PlugStackConfig={paths.etc}/plugstack.conf",
        # No systemd and no cgroups here.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        # Memory is a consumable: --mem is scheduled and, through the accounting
        # poller below, enforced (a step over it is killed), as on a production cluster.
        "SelectTypeParameters=CR_Core_Memory",
        # Without it a job that gives no --mem would take a whole node's memory.
        f"DefMemPerCPU={mem_mb // CPUS_PER_NODE}",
        # Trust the CPUs/memory written here, not what slurmd detects: both
        # nodes share one machine, which may have fewer CPUs than we announce.
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        # Without cgroups, the linux poller measures each task (sacct MaxRSS) and
        # OverMemoryKill kills a step that goes over --mem, every second.
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherParams=OverMemoryKill",
        "JobAcctGatherFrequency=task=1",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={ports['slurmdbd']}",
        # The slurmdbd connection takes its munge socket from here, not AuthInfo.
        f"AccountingStoragePass={paths.munge_socket}",
        "AccountingStorageTRES=gres/gpu",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        "JobRequeue=1",
        # Short timeouts so failures show up quickly in tests.
        "SlurmctldTimeout=10",
        "SlurmdTimeout=20",
        # Not short: the daemons share 2 cores with the jobs and the other tests. A
        # slurmd that answers an RPC past MessageTimeout has it queued for a resend
        # 60 s later (slurmctld's agent), and a requeued job reuses its job and step
        # ids: a step-kill resent after a restart ended the new start's step, though
        # nothing failed (measured at 5 s: the killed-then-stopped fault test failed in
        # about 1 run in 3 on a loaded VM; docs/operations.md).
        "MessageTimeout=20",
        "InactiveLimit=0",
        "KillWait=5",
        "Waittime=0",
        # Keep finished jobs visible to squeue/scontrol for 5 minutes.
        "MinJobAge=300",
        "SchedulerType=sched/backfill",
        # The main scheduling loop every 2 s instead of 60: a requeued job whose hold
        # ended starts within seconds (nothing else wakes the scheduler for it).
        "SchedulerParameters=sched_interval=2",
        "MailProg=/bin/true",  # no mail here; the default path does not exist
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for node in NODE_NAMES:
        lines.append(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 "
            f"Port={ports[f'slurmd-{node}']} CPUs={CPUS_PER_NODE} RealMemory={mem_mb} "
            f"Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={PARTITION} Nodes={','.join(NODE_NAMES)} Default=YES "
        "MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def _gres_conf(paths: _Paths) -> str:
    # Never probe real GPUs (NVML) even on a GPU machine: the files below are the GPUs.
    lines = ["AutoDetect=off"]
    last = GPUS_PER_NODE - 1
    for node in NODE_NAMES:
        # Without File= slurmd cannot bind GPUs to jobs and the node is drained.
        lines.append(f"NodeName={node} Name=gpu File={paths.gpus}/{node}/nvidia[0-{last}]")
    return "\n".join(lines) + "\n"


def _slurmdbd_conf(paths: _Paths, ports: Mapping[str, int], password: str) -> str:
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={ports['slurmdbd']}",
        "SlurmUser=root",
        f"PidFile={paths.run}/slurmdbd.daemon.pid",
        f"LogFile={paths.log}/slurmdbd.log",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        # TCP, not a socket: "localhost" would make the client use /run/mysqld.
        "StorageHost=127.0.0.1",
        f"StoragePort={ports['mariadb']}",
        f"StorageUser={DB_USER}",
        f"StoragePass={password}",
        f"StorageLoc={DB_NAME}",
    ]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def _make_fake_gpu(path: Path) -> None:
    """A character device aliasing /dev/null, or a plain file if mknod is not allowed.

    Slurm accepts both as gres File=, but only for character devices does it set
    CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS and SLURM_STEP_GPUS in jobs (with plain
    files it logs "not a valid character or block device" and sets only
    SLURM_GPUS_ON_NODE), so devices make jobs look like real GPU jobs.
    """
    if path.exists():
        return
    null = os.stat("/dev/null")
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, null.st_rdev)
    except OSError:
        path.touch()


def _gpus_are_devices(paths: _Paths) -> bool:
    first = paths.gpus / NODE_NAMES[0] / "nvidia0"
    return first.exists() and stat.S_ISCHR(first.stat().st_mode)


def _prepare(paths: _Paths, settings: ClusterSettings) -> None:
    """Create folders, keys, fake GPUs and configs (all idempotent)."""
    # Unix socket paths are limited to 107 bytes: munged's, MariaDB's and the
    # per-step sockets slurmd makes in its spool folder (<node>_<job>.<step>).
    longest = max(
        [
            paths.munge_socket,
            paths.db_socket,
            paths.spool / NODE_NAMES[0] / f"{NODE_NAMES[0]}_1234567890.4294967294",
        ],
        key=lambda path: len(bytes(path)),
    )
    if len(bytes(longest)) > 107:
        raise ClusterError(
            f"state folder {paths.root} is too long: socket {longest} would exceed "
            "107 bytes; use a shorter --state-dir"
        )
    # munged insists that every folder above its socket is world-executable and
    # that no folder above its key or seed file is writable by others.
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o755)
    for folder in (paths.etc, paths.log, paths.run, paths.munge, paths.db, paths.ctld_state):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
    for node in NODE_NAMES:
        (paths.spool / node).mkdir(parents=True, exist_ok=True)
        gpu_dir = paths.gpus / node
        gpu_dir.mkdir(parents=True, exist_ok=True)
        for index in range(GPUS_PER_NODE):
            _make_fake_gpu(gpu_dir / f"nvidia{index}")
    if not paths.munge_key.exists():
        paths.munge_key.write_bytes(secrets.token_bytes(1024))
    paths.munge_key.chmod(0o400)
    if not paths.db_password.exists():
        _write(paths.db_password, secrets.token_hex(16) + "\n", 0o600)
    password = paths.db_password.read_text().strip()

    _write(paths.slurm_conf, _slurm_conf(paths, settings.ports, settings.mem_per_node_mb))
    _write(paths.gres_conf, _gres_conf(paths))
    _write(paths.etc / "plugstack.conf", "")
    # slurmdbd refuses a config that others can read (it holds the DB password).
    _write(paths.slurmdbd_conf, _slurmdbd_conf(paths, settings.ports, password), 0o600)
    paths.settings.write_text(settings.to_json())


# ---------------------------------------------------------------------------- start


@contextlib.contextmanager
def _locked(paths: _Paths) -> Iterator[None]:
    """Serialise start/stop of one state folder (e.g. two pytest runs at once)."""
    paths.root.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _new_settings(paths: _Paths, base_port: int) -> ClusterSettings:
    ports = _ports(base_port)
    host = _hostname()
    return ClusterSettings(
        state_dir=str(paths.root),
        slurm_conf=str(paths.slurm_conf),
        cluster_name=CLUSTER_NAME,
        partition=PARTITION,
        nodes=[Node(n, "127.0.0.1", host, ports[f"slurmd-{n}"]) for n in NODE_NAMES],
        gpus_per_node=GPUS_PER_NODE,
        cpus_per_node=CPUS_PER_NODE,
        mem_per_node_mb=_mem_per_node_mb(),
        gpus_are_devices=False,  # known once _prepare made them
        base_port=base_port,
        ports=ports,
        pids={},
        log_dir=str(paths.log),
        munge_socket=str(paths.munge_socket),
        env={"SLURM_CONF": str(paths.slurm_conf)},
    )


def _choose_base_port(paths: _Paths, requested: int | None) -> int:
    saved = _load_optional(paths)
    if requested is None and os.environ.get(BASE_PORT_ENV):
        requested = int(os.environ[BASE_PORT_ENV])
    if saved is not None and requested not in (None, saved.base_port):
        daemons = _daemons(paths, saved.ports)
        running = [d.name for d in daemons if _running_pid(paths, d)]
        if running:
            raise ClusterError(
                f"cluster in {paths.root} runs on base port {saved.base_port} "
                f"({', '.join(running)} up); stop it before using port {requested}"
            )
    if requested is not None:
        return requested
    return saved.base_port if saved is not None else DEFAULT_BASE_PORT


def _check_port_free(port: int, owner: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the daemons do, so a socket left in TIME_WAIT by a stopped cluster is no problem.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ClusterError(
                f"port {port} for {owner} is in use ({exc}); pass another --base-port "
                f"(or set {BASE_PORT_ENV})"
            ) from exc


def start(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    base_port: int | None = None,
    timeout: float = 60.0,
    verbose: bool = True,
) -> ClusterSettings:
    """Start whatever part of the cluster is not running; return its settings.

    Idempotent: a healthy cluster is left alone. State (accounting database,
    job ids) survives stop/start; ``stop(purge=True)`` starts over. When it has
    to (re)start slurmctld, jobs still queued from before are cancelled.
    """
    paths = _paths(state_dir)
    with _locked(paths):
        base = _choose_base_port(paths, base_port)
        settings = _new_settings(paths, base)
        if not status(paths.root)["problems"]:
            _say(verbose, f"already running ({paths.root})")
            return load_settings(paths.root)
        _prepare(paths, settings)
        settings.gpus_are_devices = _gpus_are_devices(paths)
        client_env = _client_env(paths)
        pids: dict[str, int] = {}
        leftover_jobs: list[str] = []
        daemons = _daemons(paths, settings.ports)
        running = {d.name: _running_pid(paths, d) for d in daemons}
        # Check every port before starting anything, so a clash leaves nothing behind.
        for name, pid in running.items():
            if pid is None and name in settings.ports:
                _check_port_free(settings.ports[name], name)
        for daemon in daemons:
            pid = running[daemon.name]
            spawned = pid is None
            if pid is None:
                _before_spawn(paths, daemon, verbose)
                _say(verbose, f"starting {daemon.name}")
                pid = _spawn(paths, daemon)
            pids[daemon.name] = pid
            _wait_ready(paths, daemon, pid, client_env, timeout, verbose)
            if daemon.name == "slurmctld" and spawned:
                # Jobs of a cluster that was not stopped cleanly come back from the
                # saved state (requeued, JobRequeue=1) and would occupy the nodes.
                # Cancel them before the nodes return, without waiting.
                leftover_jobs = _cancel_jobs(paths, timeout=0)
                if leftover_jobs:
                    _say(verbose, f"cancelled jobs left from before: {' '.join(leftover_jobs)}")
        _wait_nodes_idle(paths, client_env, timeout, pids)
        if leftover_jobs:
            _cancel_jobs(paths, timeout)  # now that slurmd can confirm they ended
        settings.pids = pids
        paths.settings.write_text(settings.to_json())
        _say(verbose, f"cluster {CLUSTER_NAME} is up; export SLURM_CONF={paths.slurm_conf}")
        return settings


def _before_spawn(paths: _Paths, daemon: _Daemon, verbose: bool) -> None:
    if daemon.name == "munged":
        # A socket left by a killed munged makes the new one refuse to start.
        for stale in (paths.munge_socket, Path(f"{paths.munge_socket}.lock")):
            stale.unlink(missing_ok=True)
    elif daemon.name == "mariadb" and not (paths.db_data / "mysql").is_dir():
        _say(verbose, "initialising the MariaDB data folder")
        install_db = _need("mariadb-install-db", "mysql_install_db")
        result = subprocess.run(
            [
                install_db,
                "--no-defaults",
                f"--datadir={paths.db_data}",
                "--user=root",
                "--skip-test-db",
                "--skip-name-resolve",
                "--auth-root-authentication-method=socket",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        (paths.log / "mariadb-install-db.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            shutil.rmtree(paths.db_data, ignore_errors=True)  # retry from scratch next time
            raise ClusterError(
                f"mariadb-install-db failed; see {paths.log / 'mariadb-install-db.log'}:\n"
                + _tail_text(result.stdout + result.stderr)
            )


def _wait_ready(
    paths: _Paths,
    daemon: _Daemon,
    pid: int,
    client_env: Mapping[str, str],
    timeout: float,
    verbose: bool,
) -> None:
    out = paths.stdout_log(daemon.name)
    if daemon.name == "munged":
        _wait_until("munged", lambda: _munge_works(paths), timeout, out, pid)
    elif daemon.name == "mariadb":
        admin = _need("mariadb-admin", "mysqladmin")
        ping = [admin, "--no-defaults", f"--socket={paths.db_socket}", "-uroot", "ping"]
        _wait_until("mariadb", lambda: _ok(ping, client_env), timeout, out, pid)
        _create_database(paths, client_env)
    elif daemon.name == "slurmdbd":
        sacctmgr = _need("sacctmgr")
        clusters = [sacctmgr, "-n", "-P", "list", "cluster", "format=cluster"]
        _wait_until("slurmdbd", lambda: _ok(clusters, client_env), timeout, out, pid)
        if CLUSTER_NAME not in _run(clusters, client_env).stdout.split():
            # slurmctld only sends accounting for a cluster slurmdbd knows.
            _say(verbose, f"adding cluster {CLUSTER_NAME} to the accounting database")
            added = _run([sacctmgr, "-i", "add", "cluster", CLUSTER_NAME], client_env)
            if added.returncode != 0:
                raise ClusterError(f"sacctmgr add cluster failed:\n{added.stdout}{added.stderr}")
    elif daemon.name == "slurmctld":
        sinfo = [_need("sinfo"), "-h", "-o", "%P"]
        _wait_until("slurmctld", lambda: _ok(sinfo, client_env), timeout, out, pid)
    # slurmd-*: their registration is awaited for all nodes together.


def _munge_works(paths: _Paths) -> bool:
    socket_arg = f"--socket={paths.munge_socket}"
    env = dict(os.environ)
    cred = _run([_need("munge"), socket_arg, "-n"], env, timeout=5)
    if cred.returncode != 0:
        return False
    decoded = subprocess.run(
        [_need("unmunge"), socket_arg],
        input=cred.stdout,
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return decoded.returncode == 0


def _create_database(paths: _Paths, env: Mapping[str, str]) -> None:
    """Database and user for slurmdbd (idempotent; root logs in through the unix socket)."""
    password = paths.db_password.read_text().strip()
    user = f"'{DB_USER}'@'127.0.0.1'"
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {DB_NAME};"
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{password}';"
        f"ALTER USER {user} IDENTIFIED BY '{password}';"
        f"GRANT ALL ON {DB_NAME}.* TO {user};"
    )
    client = _need("mariadb", "mysql")
    result = _run(
        [client, "--no-defaults", f"--socket={paths.db_socket}", "-uroot", "-e", sql], env
    )
    if result.returncode != 0:
        raise ClusterError(f"creating the slurm database failed:\n{result.stderr}")


def _node_states(env: Mapping[str, str]) -> dict[str, str] | None:
    result = _run([_need("sinfo"), "-h", "-N", "-p", PARTITION, "-o", "%N %t"], env, timeout=10)
    if result.returncode != 0:
        return None
    states: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


def _wait_nodes_idle(
    paths: _Paths, env: Mapping[str, str], timeout: float, pids: Mapping[str, int]
) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] | None = None
    while time.monotonic() < deadline:
        for node in NODE_NAMES:
            if not _pid_alive(pids[f"slurmd-{node}"]):
                log = paths.stdout_log(f"slurmd-{node}")
                raise ClusterError(f"slurmd of {node} died; see {log}:\n{_tail(log)}")
        states = _node_states(env)
        if states and all(
            states.get(n, "").rstrip("*~#") in USABLE_NODE_STATES for n in NODE_NAMES
        ):
            return
        time.sleep(0.3)
    reasons = _run([_need("sinfo"), "-R"], env).stdout
    logs = ", ".join(str(paths.stdout_log(f"slurmd-{n}")) for n in NODE_NAMES)
    ctld_log = paths.stdout_log("slurmctld")
    raise ClusterError(
        f"nodes not usable after {timeout:.0f} s: {states}\n{reasons}\n"
        f"see {logs} and {ctld_log}:\n{_tail(ctld_log)}"
    )


# --------------------------------------------------------------------- status, stop


def _load_optional(paths: _Paths) -> ClusterSettings | None:
    try:
        return ClusterSettings.from_json(paths.settings.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def load_settings(state_dir: str | os.PathLike[str] | None = None) -> ClusterSettings:
    """Settings of the cluster in state_dir (written by start)."""
    paths = _paths(state_dir)
    settings = _load_optional(paths)
    if settings is None:
        raise ClusterError(f"no cluster settings in {paths.settings}; run start first")
    return settings


def status(state_dir: str | os.PathLike[str] | None = None) -> dict[str, list[str]]:
    """{"up": [...], "problems": [...]}: daemons alive, sinfo answering, nodes usable."""
    paths = _paths(state_dir)
    up: list[str] = []
    problems: list[str] = []
    saved = _load_optional(paths)
    if saved is None:
        return {"up": up, "problems": [f"no cluster in {paths.root}"]}
    try:
        daemons = _daemons(paths, saved.ports)
    except ClusterError as exc:
        return {"up": up, "problems": [str(exc)]}
    for daemon in daemons:
        if _running_pid(paths, daemon) is None:
            problems.append(f"{daemon.name} is down (log: {paths.stdout_log(daemon.name)})")
        else:
            up.append(daemon.name)
    if not problems:
        try:
            states = _node_states(_client_env(paths))
        except ClusterError as exc:  # sinfo not installed
            return {"up": up, "problems": [str(exc)]}
        if states is None:
            problems.append(f"sinfo does not answer (log: {paths.stdout_log('slurmctld')})")
        else:
            up.append("sinfo")
            for node in NODE_NAMES:
                state = states.get(node, "missing").rstrip("*~#")
                if state in USABLE_NODE_STATES:
                    up.append(f"node {node} {state}")
                else:
                    log = paths.stdout_log(f"slurmd-{node}")
                    problems.append(f"node {node} is {state} (log: {log})")
    return {"up": up, "problems": problems}


def is_running(state_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when every daemon is alive, sinfo answers and every node takes jobs."""
    return not status(state_dir)["problems"]


def _cancel_jobs(paths: _Paths, timeout: float) -> list[str]:
    """Cancel all unfinished jobs and wait up to timeout for them to end; returns their ids."""
    env = _client_env(paths)
    squeue = [_need("squeue"), "-h", "-t", "PD,R,CG,S,CF,RQ,RS,RH,SO", "-o", "%A"]
    jobs = _run(squeue, env, timeout=10).stdout.split()
    if jobs:
        _run([_need("scancel"), *jobs], env, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _run(squeue, env, timeout=10).stdout.split():
            time.sleep(0.3)
    return jobs


def stop(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    purge: bool = False,
    timeout: float = 20.0,
    verbose: bool = True,
) -> None:
    """Stop the daemons this module started in state_dir, newest first.

    Only pids from our pid files whose /proc entry still shows the expected
    program with our state-folder tag are signalled. The folder (logs) stays
    unless purge is set.
    """
    paths = _paths(state_dir)
    if not paths.root.exists():
        _say(verbose, f"nothing to stop: {paths.root} does not exist")
        return
    with _locked(paths):
        saved = _load_optional(paths)
        try:
            daemons = _daemons(paths, saved.ports if saved else _ports(DEFAULT_BASE_PORT))
        except ClusterError:
            daemons = []  # programs uninstalled: nothing of ours can be running
        running = {d.name: _running_pid(paths, d) for d in daemons}
        if running.get("slurmctld") and all(running.get(f"slurmd-{n}") for n in NODE_NAMES):
            _cancel_jobs(paths, timeout)
        for daemon in reversed(daemons):
            pid = running[daemon.name]
            if pid is not None:
                _say(verbose, f"stopping {daemon.name} (pid {pid})")
                if _terminate({pid: daemon.program}, paths, timeout):
                    _say(verbose, f"{daemon.name} ignored SIGTERM for {timeout:.0f} s: killed")
            paths.pid_file(daemon.name).unlink(missing_ok=True)
        # Steps of jobs that could not be cancelled outlive slurmd; end them too.
        leftovers = _our_stepds(paths)
        if leftovers:
            tasks = _kill_descendants(leftovers)
            _say(verbose, f"killed leftover slurmstepd {sorted(leftovers)} and tasks {tasks}")
            # slurmstepd ignores SIGTERM, so this ends in SIGKILL.
            _terminate(leftovers, paths, timeout=1)
    if purge:
        # Refuse to delete a folder that does not look like one of ours.
        if not (paths.slurm_conf.exists() or paths.settings.exists()):
            raise ClusterError(f"{paths.root} does not look like a localslurm state folder")
        shutil.rmtree(paths.root)
        _say(verbose, f"removed {paths.root}")


# ------------------------------------------------------------------- node faults


def node_processes(node: str, state_dir: str | os.PathLike[str] | None = None) -> list[int]:
    """What makes up `node` on this machine: its slurmd, the slurmstepd it forked
    for jobs and everything below them (batch scripts, tasks). Freezing them all
    (SIGSTOP) is a node that hung or dropped off the network."""
    paths = _paths(state_dir)
    settings = load_settings(paths.root)
    slurmd = _running_pid(paths, _Daemon(f"slurmd-{node}", "slurmd", []))
    if node not in settings.node_names or slurmd is None:
        raise ClusterError(f"node {node} is not running in {paths.root}")
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    mark = f"SLURMD_NODENAME={node}".encode()
    found = [slurmd]
    for stepd in _our_stepds(paths):
        below, pending = [], list(children.get(stepd, []))
        while pending:
            pid = pending.pop()
            below.append(pid)
            pending += children.get(pid, [])
        # A step's processes carry the node they run on; the stepd itself does not.
        with contextlib.suppress(OSError):
            if any(mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in below):
                found += [stepd, *below]
    return found


def freeze_node(node: str, state_dir: str | os.PathLike[str] | None = None) -> list[int]:
    """SIGSTOP the node's slurmd, step daemons and tasks; returns the pids."""
    pids = node_processes(node, state_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    return pids


def thaw(pids: Iterable[int]) -> None:
    """SIGCONT what freeze_node stopped (tasks first: their stepd kills them if
    slurmctld has ended the job meanwhile)."""
    for pid in reversed(list(pids)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


# ------------------------------------------------------------------ external cluster


def describe_external(partition: str | None = None) -> ClusterSettings:
    """Settings of an existing cluster (whatever sinfo talks to), for running the
    tests against a real cluster: nothing is started or stopped."""
    env = dict(os.environ)
    sinfo = _need("sinfo")
    if partition is None:
        names = _run([sinfo, "-h", "-o", "%P"], env).stdout.split()
        defaults = [p.rstrip("*") for p in names if p.endswith("*")]
        if not defaults:
            raise ClusterError("sinfo shows no default partition; set one explicitly")
        partition = defaults[0]
    result = _run([sinfo, "-h", "-N", "-p", partition, "-o", "%N|%o|%n|%c|%m|%G"], env)
    if result.returncode != 0 or not result.stdout.strip():
        raise ClusterError(f"sinfo -p {partition} failed: {result.stderr.strip()}")
    nodes: dict[str, Node] = {}
    gpus: list[int] = []
    cpus: list[int] = []
    mems: list[int] = []
    for line in result.stdout.splitlines():
        name, addr, host, ncpu, mem, gres = line.split("|")
        nodes[name] = Node(name, addr, host, 0)
        cpus.append(int(ncpu))
        mems.append(int(mem.rstrip("+")))
        gpus.append(_count_gpus(gres))
    config = _run([_need("scontrol"), "show", "config"], env).stdout
    values = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition("=") for line in config.splitlines())
    )
    return ClusterSettings(
        state_dir="",
        slurm_conf=values.get("SLURM_CONF", os.environ.get("SLURM_CONF", "")),
        cluster_name=values.get("ClusterName", ""),
        partition=partition,
        nodes=list(nodes.values()),
        gpus_per_node=min(gpus),
        cpus_per_node=min(cpus),
        mem_per_node_mb=min(mems),
        gpus_are_devices=True,
        base_port=0,
        ports={},
        pids={},
        log_dir="",
        munge_socket="",
        env={},
        external=True,
    )


def _count_gpus(gres: str) -> int:
    """4 from "gpu:4", "gpu:a100:4(S:0-1)" or "gpu:2,gpu:h100:2"; 0 without GPUs."""
    total = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


# ---------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "command", choices=["install", "start", "stop", "status", "env"], help="what to do"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"state folder (default ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=None,
        help=f"first of 6 ports: ctld, dbd, mariadb, slurmd n1-n3 (default {DEFAULT_BASE_PORT})",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per start step")
    parser.add_argument("--purge", action="store_true", help="stop: also delete the state folder")
    args = parser.parse_args(argv)

    try:
        if args.command == "install":
            install()
        elif args.command == "start":
            settings = start(args.state_dir, base_port=args.base_port, timeout=args.timeout)
            print(settings.to_json(), end="")
        elif args.command == "stop":
            stop(args.state_dir, purge=args.purge)
        elif args.command == "status":
            report = status(args.state_dir)
            for item in report["up"]:
                print(f"up: {item}")
            for item in report["problems"]:
                print(f"DOWN: {item}")
            return 1 if report["problems"] else 0
        elif args.command == "env":
            for key, value in load_settings(args.state_dir).env.items():
                print(f"export {key}={shlex.quote(value)}")
    except ClusterError as exc:
        print(f"localslurm: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
