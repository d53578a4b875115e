"""`stoker doctor`'s site profile check, and the MLflow check that uses its
tracking_uri: the store `stoker submit` would use for an experiment that sets none.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker.launcher.doctor.check import Finding, joined_lines, not_checked
from stoker.launcher.doctor.job_target import JobTarget
from stoker.launcher.doctor.tracking_store import check_tracking_store


@dataclass
class ProfileProbe:
    """The site profile, loaded once; the MLflow check uses its tracking_uri."""

    blocked: str | None = "the profile check did not run"
    tracking_uri: str | None = None
    job_target: JobTarget | None = None
    """Where the profile sends jobs: its partition, account and QOS."""

    def check_profile(self) -> list[Finding]:
        from stoker.config import ConfigError, resolve_config
        from stoker.config.profile import find_profile

        self.blocked = "the site profile does not load"
        path = find_profile()
        try:
            resolved = resolve_config(profile=path)
        except ConfigError as exc:
            problems = "; ".join(joined_lines(str(problem)) for problem in exc.problems)
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
        job = resolved.config.job
        source = str(resolved.profile) if resolved.profile is not None else "no site profile"
        self.job_target = JobTarget(source, job.partition, job.account, job.qos)
        if resolved.profile is None:
            from stoker.home import default_profile_path

            detail = f"none ($STOKER_PROFILE unset, no {default_profile_path()})"
            return [Finding("profile", "ok", detail)]
        return [Finding("profile", "ok", f"{resolved.profile} is valid")]

    def check_mlflow(self) -> list[Finding]:
        if self.blocked:
            return [not_checked("mlflow", self.blocked, "profile")]
        from stoker.tracking.store import resolve_tracking_uri, tracking_off

        if tracking_off(self.tracking_uri):
            detail = "tracking_uri is none: no MLflow store; runs write metrics.jsonl"
            return [Finding("mlflow", "ok", detail)]
        # The store `stoker submit` would use for an experiment that sets no tracking.uri.
        return [check_tracking_store(resolve_tracking_uri(self.tracking_uri))]
