"""`stoker doctor`'s checks: can this machine submit stoker jobs, and will they run?

Each check returns findings (`ok`, `warn` or `fail`, what was found, and the fix
when not ok). `run_checks` runs them one after another, each isolated: a check
that raises becomes a `fail` finding and the others still run. Every external
command gets `COMMAND_TIMEOUT` seconds, so a hung controller costs seconds, not
minutes.

    check.py           the finding, its level, what every check shares
    checklist.py       the checks in order; `run_checks`
    slurm.py           client, controller, partitions, accounting, requeue, pyxis
    node.py            apptainer, GPUs, NCCL variables
    storage.py         writable and shared folders; the run folder
    site_profile.py    the site profile, and the MLflow check from its tracking_uri
    job_target.py      the profile's partition, account and QOS against SLURM's
    tracking_store.py  the MLflow store: a sqlite file or a server

Standard library only: no mlflow, torch or requests import.
"""

from __future__ import annotations

from stoker.launcher.doctor.check import COMMAND_TIMEOUT, Check, CheckLevel, Finding
from stoker.launcher.doctor.checklist import default_checks, run_checks, run_isolated
from stoker.launcher.doctor.node import summarize_gpus
from stoker.launcher.doctor.slurm import (
    SlurmProbe,
    describe_partition,
    parse_sinfo,
    plugstack_mentions_pyxis,
)
from stoker.launcher.doctor.storage import mount_of
from stoker.launcher.doctor.tracking_store import check_tracking_store

__all__ = [
    "COMMAND_TIMEOUT",
    "Check",
    "CheckLevel",
    "Finding",
    "SlurmProbe",
    "check_tracking_store",
    "default_checks",
    "describe_partition",
    "mount_of",
    "parse_sinfo",
    "plugstack_mentions_pyxis",
    "run_checks",
    "run_isolated",
    "summarize_gpus",
]
