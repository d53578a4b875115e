"""`stoker doctor`'s check of where the profile sends jobs: its partition among the
partitions `sinfo` listed (no extra call), and its account and QOS among this user's
associations (one `sacctmgr` call, made only when the profile names one of them).
SLURM refuses a job for any of them at submission; this says so before.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass

from stoker.launcher.doctor.check import COMMAND_TIMEOUT, Finding, not_checked
from stoker.launcher.doctor.slurm import SlurmProbe
from stoker.launcher.slurm.cli import SlurmError, run_slurm

CHECK = "profile job target"


@dataclass(frozen=True)
class JobTarget:
    """Where the site profile sends jobs (`job.partition`, `job.account`, `job.qos`)."""

    source: str
    """Where the values come from, for the messages: the profile's path."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None


def check_job_target(slurm: SlurmProbe, target: JobTarget | None, blocked: str | None) -> Finding:
    """The profile's partition, account and QOS against the cluster's, every problem in
    one finding; `blocked`: why the profile is not known (its check failed)."""
    if target is None or blocked:
        return not_checked(CHECK, blocked or "the site profile did not load", "profile")
    if slurm.partitions is None:
        return not_checked(CHECK, slurm.blocked or "sinfo listed no partition", "partitions")
    names = [p.name for p in slurm.partitions]
    default = next((p.name for p in slurm.partitions if p.default), None)
    found: list[str] = []
    problems: list[str] = []
    fixes: list[str] = []
    if target.partition is None and default is None:
        problems.append("it names no partition, and the cluster has no default one")
        fixes.append(f"`partition: <one of {', '.join(names)}>`")
    elif target.partition is None:
        found.append(f"no partition named: jobs go to the cluster's default, {default}")
    elif target.partition not in names:
        problems.append(
            f"partition {target.partition!r} is not a partition of this cluster (sinfo "
            f"lists {', '.join(names) or 'none'})"
        )
        fixes.append(f"`partition: {default or (names[0] if names else '<partition>')}`")
    else:
        found.append(f"partition {target.partition} exists")
    user = os.environ.get("USER") or getpass.getuser()
    if target.account is not None or target.qos is not None:
        try:
            accounts, qos_names = _associations(user)
        except SlurmError as exc:
            found.append(f"account/QOS not checked: sacctmgr fails: {exc.stderr or exc.message}")
        else:
            for kind, value, allowed in (
                ("account", target.account, accounts),
                ("qos", target.qos, qos_names),
            ):
                if value is None:
                    continue
                if value in allowed:
                    found.append(f"{kind} {value} is {user}'s")
                    continue
                problems.append(
                    f"{kind} {value!r} is not one of {user}'s ({', '.join(allowed) or 'none'})"
                )
                fixes.append(f"`{kind}: {allowed[0] if allowed else '<' + kind + '>'}`")
    if problems:
        return Finding(
            CHECK,
            "fail",
            f"{target.source}: {'; '.join(problems)}: SLURM refuses every submit that uses it",
            f"set {' and '.join(fixes)} in {target.source} (`sinfo -s` lists the partitions, "
            f"`sacctmgr show assoc user={user}` your accounts and QOS), or override it at each "
            "submit (--partition P, job.account=A, job.qos=Q)",
        )
    return Finding(CHECK, "ok", f"{target.source}: {'; '.join(found)}")


def _associations(user: str) -> tuple[list[str], list[str]]:
    """The accounts and QOS names of `user`'s associations, sorted (one sacctmgr call)."""
    command = f"sacctmgr --noheader --parsable2 show assoc user={user} format=account,qos"
    text = run_slurm(
        command.split(),
        timeout=COMMAND_TIMEOUT,
    )
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    accounts = sorted({row[0] for row in rows if row[0]})
    qos_names = sorted({q for row in rows if len(row) > 1 for q in row[1].split(",") if q})
    return accounts, qos_names
