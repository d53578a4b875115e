"""`stoker doctor`'s SLURM checks: the client and controller, partitions, accounting,
requeue and preemption, pyxis. They share one `SlurmProbe`, which asks the controller
each question once (`scontrol ping`, `scontrol show config`, one `sinfo`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from stoker.launcher.doctor.check import COMMAND_TIMEOUT, Finding, not_checked
from stoker.launcher.slurm.cli import SlurmError, run_slurm
from stoker.launcher.slurm.query import parse_show_config

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
    partitions: list[PartitionSummary] | None = None
    """What `sinfo` listed (None until check_partitions ran it)."""

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
        partitions = self.partitions = parse_sinfo(text)
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
