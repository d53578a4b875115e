"""`stoker doctor`'s checks: can this machine submit stoker jobs, and will they run?

Each check returns findings (`ok`, `warn` or `fail`, what was found, and the fix
when not ok). `run_checks` runs them one after another, each isolated: a check
that raises becomes a `fail` finding and the others still run. Every external
command gets `COMMAND_TIMEOUT` seconds, so a hung controller costs seconds, not
minutes. The SLURM checks share one `SlurmProbe`, which asks the controller each
question once (`scontrol ping`, `scontrol show config`, one `sinfo`).

Standard library only: no mlflow, torch or requests import.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from stoker.errors import StokerError
from stoker.launcher.slurm_cli import SlurmError, run_slurm

if TYPE_CHECKING:
    from stoker.launcher.tracking import TrackingTarget

Status = Literal["ok", "warn", "fail"]

COMMAND_TIMEOUT = 10.0
HTTP_TIMEOUT = 5.0


@dataclass(frozen=True)
class Finding:
    """One line of the report. `fix` is None when there is nothing to do."""

    check: str
    status: Status
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


Check = tuple[str, Callable[[], list[Finding]]]


def run_checks(checks: Sequence[Check] | None = None) -> list[Finding]:
    """Run every check (default: `default_checks()`) and return all findings, in order."""
    findings: list[Finding] = []
    for name, check in checks if checks is not None else default_checks():
        findings += run_isolated(name, check)
    return findings


def run_isolated(name: str, check: Callable[[], list[Finding]]) -> list[Finding]:
    """The check's findings, or one `fail` finding if it raised."""
    try:
        return check()
    except StokerError as exc:
        return [Finding(name, "fail", one_line(exc.message), exc.fix and one_line(exc.fix))]
    except Exception as exc:  # one broken check must not hide the others' findings
        return [
            Finding(
                name,
                "fail",
                f"the check itself failed: {type(exc).__name__}: {exc}",
                "this is a bug in `stoker doctor`: please report it with this line",
            )
        ]


def one_line(text: str) -> str:
    """Multi-line messages (a config error lists its problems) as one report line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def default_checks() -> list[Check]:
    slurm = SlurmProbe()
    profile = ProfileProbe()
    return [
        ("slurm", slurm.check_slurm),
        ("partitions", slurm.check_partitions),
        ("accounting", slurm.check_accounting),
        ("requeue", slurm.check_requeue),
        ("pyxis", slurm.check_pyxis),
        ("apptainer", check_apptainer),
        ("profile", profile.check_profile),
        ("mlflow", profile.check_mlflow),
        ("run folder", check_run_folder),
        ("gpus", check_gpus),
        ("nccl env", check_nccl_env),
    ]


def not_checked(check: str, reason: str, see: str) -> Finding:
    return Finding(check, "warn", f"not checked: {reason}", f"see the `{see}` line above")


# --------------------------------------------------------------------------- SLURM

# sinfo's node states (`%T`, suffix flags stripped) in which a node can take new jobs.
USABLE_NODE_STATES = frozenset(["idle", "mixed", "allocated", "completing", "planned", "reserved"])

SINFO_FORMAT = "%P|%a|%l|%D|%T|%G"


@dataclass
class PartitionSummary:
    """One partition as `sinfo` reports it, its per-state rows added up."""

    name: str
    default: bool
    available: str
    time_limit: str
    node_states: dict[str, int] = field(default_factory=dict)
    gres: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        return sum(self.node_states.values())

    @property
    def usable_nodes(self) -> int:
        return sum(n for state, n in self.node_states.items() if node_state_usable(state))

    @property
    def up(self) -> bool:
        return self.available == "up"


def node_state_usable(state: str) -> bool:
    """`idle~` (powered down, starts on demand) is usable; `idle*` (not responding) is not."""
    if state.endswith("*"):
        return False
    return state.rstrip("~#%!$@^-+") in USABLE_NODE_STATES


def parse_sinfo(text: str) -> list[PartitionSummary]:
    """Partitions from `sinfo --noheader --format=SINFO_FORMAT`, in sinfo's order.

    sinfo prints one row per (partition, state, GRES) group; the default partition's
    name carries a `*`.
    """
    partitions: dict[str, PartitionSummary] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        raw_name, available, time_limit, count, state, gres = line.split("|", 5)
        name = raw_name.rstrip("*")
        part = partitions.setdefault(
            name,
            PartitionSummary(name, raw_name.endswith("*"), available, time_limit),
        )
        part.node_states[state] = part.node_states.get(state, 0) + int(count)
        if gres not in part.gres:
            part.gres.append(gres)
    return list(partitions.values())


def parse_show_config(text: str) -> dict[str, str]:
    """`Key = value` lines of `scontrol show config`; other lines are skipped."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^(\S+)\s*=\s?(.*)$", line)
        if match:
            config[match.group(1)] = match.group(2).strip()
    return config


def describe_partition(part: PartitionSummary) -> Finding:
    check = f"partition {part.name}"
    states = ", ".join(f"{n} {state}" for state, n in part.node_states.items())
    gres = [g for g in part.gres if g and g != "(null)"]
    gres_text = f"{' / '.join(gres)} per node" if gres else "no GRES (no GPUs)"
    detail = (
        f"{'default, ' if part.default else ''}{part.available}, "
        f"{part.nodes} node{'s' if part.nodes != 1 else ''} ({states}), {gres_text}, "
        f"time limit {part.time_limit}"
    )
    if not part.up:
        return Finding(
            check,
            "warn",
            detail,
            f"jobs sent to {part.name} stay pending while it is {part.available}: use another "
            f"partition (--partition), or ask the admins (`scontrol show partition {part.name}`)",
        )
    if part.usable_nodes == 0:
        return Finding(
            check,
            "warn",
            detail,
            f"no node of {part.name} can take jobs: `sinfo -R -p {part.name}` lists the reasons; "
            "ask the admins to resume them",
        )
    return Finding(check, "ok", detail)


@dataclass
class SlurmProbe:
    """The SLURM checks, sharing what the controller said.

    `blocked` says why the controller cannot be asked (None once `check_slurm`
    succeeded); the checks that need the controller report "not checked" then.
    """

    blocked: str | None = "the slurm check did not run"
    client_works: bool = False
    """The commands start (slurm.conf readable), whether or not the controller answers."""
    config: dict[str, str] = field(default_factory=dict)

    def check_slurm(self) -> list[Finding]:
        client = next((c for c in ("sinfo", "scontrol") if shutil.which(c)), None)
        if client is None or shutil.which("scontrol") is None:
            self.blocked = "SLURM commands are not on PATH"
            missing = "sinfo and scontrol" if client is None else "scontrol"
            return [
                Finding(
                    "slurm",
                    "fail",
                    f"{missing} not found on PATH: this machine cannot talk to SLURM",
                    "run stoker on a SLURM login node (or `module load slurm` first); "
                    "`stoker run` trains on this machine without SLURM",
                )
            ]
        where = os.environ.get("SLURM_CONF")
        conf = f"SLURM_CONF={where}" if where else "the default slurm.conf (SLURM_CONF unset)"
        # Every SLURM command, even `--version`, retries an unreadable slurm.conf for 60 s.
        if where and not Path(where).is_file():
            self.blocked = "SLURM_CONF names no file"
            return [
                Finding(
                    "slurm",
                    "fail",
                    f"SLURM_CONF={where} names no file",
                    "point SLURM_CONF at this cluster's slurm.conf, or unset it to use the "
                    "default one",
                )
            ]
        self.blocked = "the SLURM client does not start"
        try:
            version = run_slurm([client, "--version"], timeout=COMMAND_TIMEOUT).split()[-1]
        except SlurmError as exc:
            return [
                Finding(
                    "slurm",
                    "fail",
                    f"`{client} --version` fails with {conf}: {exc.stderr or exc.message}",
                    "SLURM commands wait up to 60 s for a slurm.conf they cannot read: check "
                    "that it exists and is readable (or that configless mode reaches slurmctld)",
                )
            ]
        self.client_works = True
        self.blocked = "the SLURM controller does not answer"
        try:
            ping = run_slurm(["scontrol", "ping"], timeout=COMMAND_TIMEOUT)
        except SlurmError as exc:
            # A controller that is down makes scontrol exit 1 with nothing on stderr.
            hung = isinstance(exc.__cause__, subprocess.TimeoutExpired)
            reason = exc.stderr or (f"no answer in {COMMAND_TIMEOUT:.0f} s" if hung else "")
            return [
                Finding(
                    "slurm",
                    "fail",
                    f"slurm {version} client, but the controller does not answer "
                    f"`scontrol ping` ({conf})" + (f": {reason}" if reason else ""),
                    "check that slurmctld runs on the SlurmctldHost named in slurm.conf and "
                    "that SLURM_CONF names this cluster's slurm.conf (`scontrol ping` tells)",
                )
            ]
        self.blocked = "`scontrol show config` failed"
        self.config = parse_show_config(
            run_slurm(["scontrol", "show", "config"], timeout=COMMAND_TIMEOUT)
        )
        self.blocked = None
        controllers = re.findall(r"Slurmctld\((\w+)\) at (\S+) is (\w+)", ping)
        states = ", ".join(
            f"{'' if role == 'primary' else role + ' '}{host} {state.lower()}"
            for role, host, state in controllers
        )
        states = states or "up"
        cluster = self.config.get("ClusterName", "?")
        return [Finding("slurm", "ok", f"{version}, cluster {cluster}, controller {states}")]

    def check_partitions(self) -> list[Finding]:
        if self.blocked:
            return [not_checked("partitions", self.blocked, "slurm")]
        text = run_slurm(
            ["sinfo", "--noheader", f"--format={SINFO_FORMAT}"], timeout=COMMAND_TIMEOUT
        )
        partitions = parse_sinfo(text)
        if not partitions:
            return [
                Finding(
                    "partitions",
                    "warn",
                    "sinfo lists no partition this user can see",
                    "ask the admins which partition and account to use (`sacctmgr show assoc "
                    "user=$USER`)",
                )
            ]
        return [describe_partition(part) for part in partitions]

    def check_accounting(self) -> list[Finding]:
        if self.blocked:
            return [not_checked("accounting", self.blocked, "slurm")]
        storage = self.config.get("AccountingStorageType", "accounting_storage/none")
        if storage.endswith("/none"):
            return [
                Finding(
                    "accounting",
                    "warn",
                    f"AccountingStorageType={storage}: sacct has no job history",
                    "stoker status falls back to squeue and loses finished jobs' state; "
                    "ask the admins for slurmdbd accounting",
                )
            ]
        try:
            run_slurm(
                ["sacct", "--noheader", "-X", "--starttime=now", "--format=JobID"],
                timeout=COMMAND_TIMEOUT,
            )
        except SlurmError as exc:
            return [
                Finding(
                    "accounting",
                    "warn",
                    f"{storage}, but sacct fails: {exc.stderr or exc.message}",
                    "stoker status falls back to squeue and loses finished jobs' state; "
                    "ask the admins to check slurmdbd (`sacctmgr show cluster`)",
                )
            ]
        return [Finding("accounting", "ok", f"{storage}, sacct answers")]

    def check_requeue(self) -> list[Finding]:
        if self.blocked:
            return [not_checked("requeue", self.blocked, "slurm")]
        requeue = self.config.get("JobRequeue", "?")
        meaning = {"1": "jobs requeue by default", "0": "jobs do not requeue by default"}.get(
            requeue, "unknown default"
        )
        preempt_type = self.config.get("PreemptType", "preempt/none")
        preempt_mode = self.config.get("PreemptMode", "OFF")
        detail = f"JobRequeue={requeue} ({meaning}; stoker passes --requeue anyway)"
        if preempt_type.endswith("/none") or preempt_mode.upper() == "OFF":
            return [Finding("requeue", "ok", f"{detail}; preemption off ({preempt_type})")]
        detail += f"; preemption {preempt_type}, PreemptMode={preempt_mode}"
        if "CANCEL" in preempt_mode.upper():
            return [
                Finding(
                    "requeue",
                    "warn",
                    detail,
                    "preempted jobs are cancelled, not requeued: resubmit them with "
                    "`stoker requeue JOB`, or ask the admins for PreemptMode=REQUEUE",
                )
            ]
        return [Finding("requeue", "ok", detail)]

    def check_pyxis(self) -> list[Finding]:
        if shutil.which("srun") is None:
            return [not_checked("pyxis", "srun is not on PATH", "slurm")]
        if not self.client_works:
            return [not_checked("pyxis", self.blocked or "srun does not start", "slurm")]
        # srun loads the SPANK plugins when it prints its help: no controller call.
        if "--container-image" in run_slurm(["srun", "--help"], timeout=COMMAND_TIMEOUT):
            return [Finding("pyxis", "ok", "srun --container-image is available (pyxis)")]
        plugstack = self.config.get("PlugStackConfig", "")
        if plugstack and plugstack_mentions_pyxis(Path(plugstack)):
            return [Finding("pyxis", "ok", f"{plugstack} loads pyxis")]
        return [
            Finding(
                "pyxis",
                "warn",
                "not found: srun has no --container-image option",
                "only needed for `job.template: pyxis`; use `job.template: apptainer` or ask "
                "the admins for pyxis and enroot",
            )
        ]


def plugstack_mentions_pyxis(path: Path) -> bool:
    """True when plugstack.conf, or a file it includes, names spank_pyxis."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    if "pyxis" in text:
        return True
    for match in re.finditer(r"^\s*include\s+(\S+)", text, re.M):
        pattern = path.parent / match.group(1)  # an absolute pattern replaces the parent
        for included in sorted(Path("/").glob(str(pattern).lstrip("/"))):
            try:
                if "pyxis" in included.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


# --------------------------------------------------------------------------- commands


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """A non-SLURM command with the doctor's timeout; a hang becomes a StokerError."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StokerError(
            f"`{' '.join(argv)}` did not answer within {COMMAND_TIMEOUT:.0f} s",
            fix="a hung driver or file system: run it by hand and ask the admins",
        ) from exc


def check_apptainer() -> list[Finding]:
    program = shutil.which("apptainer") or shutil.which("singularity")
    if program is None:
        return [
            Finding(
                "apptainer",
                "warn",
                "not found: neither apptainer nor singularity is on PATH here",
                "only needed for `job.template: apptainer`, and on the compute nodes; "
                "try `module load apptainer`, or ask the admins",
            )
        ]
    result = run_command([program, "--version"])
    version = (result.stdout or result.stderr).strip() or f"exit {result.returncode}"
    return [Finding("apptainer", "ok", f"{version} ({program})")]


def check_gpus() -> list[Finding]:
    program = shutil.which("nvidia-smi")
    if program is None:
        return [
            Finding(
                "gpus",
                "ok",
                "no nvidia-smi on this node (login nodes often have no GPUs; jobs use the "
                "compute nodes')",
            )
        ]
    result = run_command(
        [program, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        return [
            Finding(
                "gpus",
                "warn",
                f"nvidia-smi fails here: {message}",
                "a driver/library mismatch needs a reboot or driver reload; on a login node "
                "without GPUs this does not affect jobs",
            )
        ]
    return [Finding("gpus", "ok", summarize_gpus(result.stdout))]


def summarize_gpus(csv_text: str) -> str:
    """`8x NVIDIA H100 80GB HBM3 (81559 MiB), driver 550.54.15` from nvidia-smi's CSV."""
    counts: dict[tuple[str, str], int] = {}
    drivers: list[str] = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        name, driver, memory = parts
        counts[(name, memory)] = counts.get((name, memory), 0) + 1
        if driver not in drivers:
            drivers.append(driver)
    if not counts:
        return "nvidia-smi lists no GPU"
    gpus = ", ".join(f"{n}x {name} ({memory})" for (name, memory), n in counts.items())
    return f"{gpus}, driver {', '.join(drivers)}"


def check_nccl_env() -> list[Finding]:
    names = sorted(k for k in os.environ if k.startswith("NCCL_"))
    if not names:
        return [Finding("nccl env", "ok", "no NCCL_* variable set here (NCCL's defaults)")]
    values = ", ".join(f"{k}={os.environ[k]}" for k in names)
    return [Finding("nccl env", "ok", f"{values} (sbatch passes this environment to jobs)")]


# --------------------------------------------------------------------------- storage

# Mount types that several machines see; everything in LOCAL_FILESYSTEMS is this node's own.
SHARED_FILESYSTEMS = frozenset(
    [
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "wekafs",
        "panfs",
        "cifs",
        "smb3",
        "fuse.sshfs",
        "pvfs2",
        "orangefs",
        "fuse.juicefs",
    ]
)
LOCAL_FILESYSTEMS = frozenset(
    [
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "tmpfs",
        "ramfs",
        "overlay",
        "vfat",
        "squashfs",
    ]
)


def mount_of(path: Path, mounts_text: str) -> tuple[str, str] | None:
    """(mount point, fs type) of the mount holding absolute `path`, from /proc/mounts text."""
    best: tuple[str, str] | None = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts escapes spaces and tabs in mount points as octal (\040, \011).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        # A later mount on the same point hides the earlier one: >= keeps the last.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sharing_finding(check: str, path: Path, what: str, fix: str) -> Finding:
    """ok, or warn (with `fix`) when `path` is on a file system local to this node."""
    try:
        mounts_text = Path("/proc/mounts").read_text()
    except OSError:
        return Finding(check, "ok", f"{what}; file system type unknown (no /proc/mounts)")
    mount = mount_of(nearest_existing(path).resolve(), mounts_text)
    fstype = mount[1] if mount else "unknown"
    if fstype in LOCAL_FILESYSTEMS:
        return Finding(
            check,
            "warn",
            f"{what}, but on {fstype} ({mount[0] if mount else '?'}), local to this node: "
            "compute nodes must see this path",
            fix,
        )
    shared = "shared" if fstype in SHARED_FILESYSTEMS else "make sure compute nodes see it"
    return Finding(check, "ok", f"{what} ({fstype}: {shared})")


def writable_folder(folder: Path) -> str | None:
    """None when a file can be created in `folder` (or the nearest existing parent, which
    a writer would create it under); else why not. Writes and deletes one temp file."""
    target = nearest_existing(folder)
    if not target.is_dir():
        return f"{target} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".stoker-doctor-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {target}: {exc.strerror}"
    return None


def check_run_folder() -> list[Finding]:
    from stoker.launcher.rundir import runs_root

    root = runs_root()
    fix = "set STOKER_HOME to a writable folder that compute nodes also see"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [Finding("run folder", "fail", f"cannot create {root}: {exc.strerror}", fix)]
    problem = writable_folder(root)
    if problem:
        return [Finding("run folder", "fail", problem, fix)]
    shared_fix = (
        "set STOKER_HOME to a folder on a shared file system (nfs, lustre, gpfs, ...); "
        "ignore this on a one-machine cluster"
    )
    return [sharing_finding("run folder", root, f"{root} writable", shared_fix)]


# --------------------------------------------------------------------------- profile, MLflow


@dataclass
class ProfileProbe:
    """The site profile, loaded once; the MLflow check uses its tracking_uri."""

    blocked: str | None = "the profile check did not run"
    tracking_uri: str | None = None

    def check_profile(self) -> list[Finding]:
        from stoker.config import ConfigError, resolve_config
        from stoker.profile import find_profile

        self.blocked = "the site profile does not load"
        path = find_profile()
        try:
            resolved = resolve_config(profile=path)
        except ConfigError as exc:
            problems = "; ".join(one_line(str(problem)) for problem in exc.problems)
            return [
                Finding(
                    "profile",
                    "fail",
                    f"site profile {path} is invalid: {problems}",
                    f"correct {path}; `stoker config show` checks it (every stoker command "
                    "that reads the profile fails until then)",
                )
            ]
        self.blocked = None
        self.tracking_uri = resolved.config.tracking.uri
        if resolved.profile is None:
            from stoker.home import default_profile_path

            detail = f"none ($STOKER_PROFILE unset, no {default_profile_path()})"
            return [Finding("profile", "ok", detail)]
        return [Finding("profile", "ok", f"{resolved.profile} is valid")]

    def check_mlflow(self) -> list[Finding]:
        if self.blocked:
            return [not_checked("mlflow", self.blocked, "profile")]
        from stoker.launcher.tracking import resolve_tracking_uri

        # The store `stoker submit` would use for an experiment that sets no tracking.uri.
        return [check_tracking_store(resolve_tracking_uri(self.tracking_uri))]


def check_tracking_store(target: TrackingTarget) -> Finding:
    """Reach the store as a job would: sqlite folder writable, or an HTTP server healthy."""
    # Doctor reads no experiment file: a tracking.uri can only come from the profile.
    if target.source == "tracking.uri":
        origin = f"{target.uri} (from the site profile's tracking_uri)"
    else:
        origin = target.describe()
    db = target.db_path
    if target.is_server:
        return check_http_store(target.uri, origin)
    if db is None:  # resolve_tracking_uri hands out sqlite or http(s) only
        raise StokerError(f"{origin}: neither a sqlite file nor a server")
    return check_sqlite_store(db, target.artifact_root, origin)


def check_sqlite_store(db: Path, artifact_root: str | None, origin: str) -> Finding:
    fix = "point tracking_uri (profile) or MLFLOW_TRACKING_URI at a writable folder"
    problem = writable_folder(db.parent)
    if problem is None and db.exists():
        try:
            with db.open("r+b"):
                pass  # opening for update checks permission without writing
        except OSError as exc:
            problem = f"cannot open {db} for writing: {exc.strerror}"
    if problem:
        return Finding("mlflow", "fail", f"{origin}: {problem}", fix)
    if artifact_root and "://" not in artifact_root:
        problem = writable_folder(Path(artifact_root))
        if problem:
            return Finding("mlflow", "fail", f"{origin}: artifact folder: {problem}", fix)
    state = "exists" if db.exists() else "created by the first submit"
    shared_fix = (
        "jobs log to this database from the compute nodes: put it on a shared file system "
        "(STOKER_HOME or tracking_uri), or run `mlflow server`; ignore this on a one-machine "
        "cluster"
    )
    return sharing_finding(
        "mlflow", db.parent, f"{origin}: folder writable, database {state}", shared_fix
    )


def check_http_store(uri: str, origin: str) -> Finding:
    health = uri.rstrip("/") + "/health"
    fix = (
        "start the server (`mlflow server --host 0.0.0.0 --port PORT --backend-store-uri ...`) "
        "or point tracking_uri (profile) / MLFLOW_TRACKING_URI at a running one"
    )
    try:
        with urllib.request.urlopen(health, timeout=HTTP_TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return Finding(
                "mlflow",
                "warn",
                f"{origin}: {health} answered {exc.code} {exc.reason}",
                "set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN",
            )
        return Finding(
            "mlflow",
            "fail",
            f"{origin}: {health} answered {exc.code} {exc.reason}: is this an MLflow server?",
            fix,
        )
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            # MLflow verifies TLS with its own settings, which urllib does not read.
            return Finding(
                "mlflow",
                "warn",
                f"{origin}: TLS check of {health} failed here: {exc.reason}",
                "if MLflow itself connects (MLFLOW_TRACKING_SERVER_CERT_PATH, "
                "REQUESTS_CA_BUNDLE), ignore this; else fix the server's certificate",
            )
        return Finding("mlflow", "fail", f"{origin}: cannot reach {health}: {exc.reason}", fix)
    except OSError as exc:  # timeouts and resets after connecting
        return Finding("mlflow", "fail", f"{origin}: cannot reach {health}: {exc}", fix)
    return Finding("mlflow", "ok", f"{origin}: server healthy (GET /health: {status})")
