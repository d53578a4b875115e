"""The checks `stoker doctor` runs, in order, and how: one after another, each
isolated, so a check that raises becomes a `fail` finding and the others still run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stoker.errors import StokerError
from stoker.launcher.doctor.check import Check, Finding, joined_lines
from stoker.launcher.doctor.job_target import CHECK as JOB_TARGET_CHECK
from stoker.launcher.doctor.job_target import check_job_target
from stoker.launcher.doctor.node import check_apptainer, check_gpus, check_nccl_env
from stoker.launcher.doctor.site_profile import ProfileProbe
from stoker.launcher.doctor.slurm import SlurmProbe
from stoker.launcher.doctor.storage import check_run_folder


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
        return [Finding(name, "fail", joined_lines(exc.message), exc.fix and joined_lines(exc.fix))]
    except Exception as exc:  # one broken check must not hide the others' findings
        return [
            Finding(
                name,
                "fail",
                f"the check itself failed: {type(exc).__name__}: {exc}",
                "this is a bug in `stoker doctor`: please report it with this line",
            )
        ]


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
        (
            JOB_TARGET_CHECK,
            lambda: [check_job_target(slurm, profile.job_target, profile.blocked)],
        ),
        ("mlflow", profile.check_mlflow),
        ("run folder", check_run_folder),
        ("gpus", check_gpus),
        ("nccl env", check_nccl_env),
    ]
