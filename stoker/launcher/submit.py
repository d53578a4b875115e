"""`stoker submit` and `stoker sweep`: from a resolved experiment to a queued SLURM job.

Order matters, so that a failure loses nothing and leaves nothing half-done:
validate → run folder → code snapshot → frozen config(s) → MLflow run(s) → render →
`sbatch --test-only` → `sbatch --parsable` → ledger. A refusal by SLURM marks the
MLflow run failed and removes the run folder; no job runs from an invalid config.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.atomic_write import write_text_atomic
from stoker.config import ResolvedConfig, freeze_config
from stoker.errors import StokerError
from stoker.launcher.ledger import JobRecord, Ledger
from stoker.protocol import TRAIN_MODULE
from stoker.launcher.render import RenderedScript, Shell, render_sbatch
from stoker.launcher.rundir import RunDir, new_run_dir, runs_root
from stoker.launcher.slurm_cli import run_slurm
from stoker.launcher.spec import LaunchSpec
from stoker.launcher.tracking import config_params

# `--after 123`, `--after 123_4`, `--after 123:456` (all must succeed).
_AFTER = re.compile(r"^\d+(_\d+)?(:\d+(_\d+)?)*$")
# Characters that would break an `#SBATCH --output=` path or the script's quoting rules.
_UNSAFE_PATH = re.compile(r"[\s'\"\\\x00-\x1f\x7f]")


class NotRecordedError(StokerError):
    """sbatch queued the job, but recording it (ledger, MLflow) failed: its run folder
    stays, since the job reads its script and config from there."""


@dataclass(frozen=True)
class SubmitOptions:
    """What the command line adds to the experiment."""

    command: Sequence[str] = ()
    after: str | None = None
    dry_run: bool = False
    explain: bool = False
    local: bool = False
    code: Path | None = None
    snapshot: bool = True
    max_parallel: int | None = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass(frozen=True)
class Submitted:
    job_id: str
    run_dir: Path
    run_id: str | None
    run_link: str | None
    script: RenderedScript
    child_run_ids: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "job_id": self.job_id,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
        }
        if self.child_run_ids:
            data["child_run_ids"] = list(self.child_run_ids)
        return data


def task_command(resolved: ResolvedConfig, options: SubmitOptions) -> list[str]:
    """The argv each task runs: the user's command, or the training runtime on the config."""
    if options.command:
        return list(options.command)
    if importlib.util.find_spec(TRAIN_MODULE) is None:
        raise StokerError(
            f"no command given, and the training runtime ({TRAIN_MODULE}) is not in this "
            "version of stoker",
            fix="pass the command each task runs after `--`, e.g. "
            "`stoker submit exp.yaml -- python train.py`",
        )
    python = "python" if resolved.config.job.container else sys.executable
    return [python, "-m", TRAIN_MODULE, "--config", Shell('"$STOKER_CONFIG"')]


def config_hash(frozen_bodies: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for body in frozen_bodies:
        # The header carries a time stamp; the hash is of the values only.
        digest.update(
            "".join(line for line in body.splitlines(True) if not line.startswith("#")).encode()
        )
    return digest.hexdigest()


def check_run_root(root: Path) -> None:
    if _UNSAFE_PATH.search(str(root)):
        raise StokerError(
            f"the runs folder {str(root)!r} contains whitespace, a quote, a backslash or a "
            "control character, which SLURM's #SBATCH --output cannot take",
            fix="set STOKER_HOME to a path without them",
        )


def submit(
    resolved: ResolvedConfig | Sequence[ResolvedConfig],
    options: SubmitOptions,
    *,
    sweep_params: Sequence[dict[str, str]] | None = None,
) -> Submitted:
    """Submit one job, or one job array when given several configs (a sweep).

    Returns at once with the job id; with `dry_run` nothing is created or submitted
    and `job_id` is empty.
    """
    configs = [resolved] if isinstance(resolved, ResolvedConfig) else list(resolved)
    is_array = not isinstance(resolved, ResolvedConfig)
    base = configs[0]
    command = task_command(base, options)
    check_command(command)
    for cfg in configs[1:]:
        if cfg.config.job != base.config.job:
            raise StokerError(
                "a sweep may not vary job.* keys: all tasks of a job array share one allocation",
                fix="sweep over model, data, optim or train keys; submit job variants separately",
            )
    root = runs_root()
    check_run_root(root)
    frozen = [freeze_config(cfg) for cfg in configs]
    chash = config_hash(frozen)

    from stoker.launcher.tracking import resolve_tracking_uri

    target = resolve_tracking_uri(base.config.tracking.uri)

    # Rendered before anything is created, for a dry run and as the last check of a
    # real one: a template or setup line that fails here leaves no run folder or MLflow run.
    preview_dir = RunDir(root / f"{base.config.job.name}-<time>-<id>")
    placeholder = ["<MLflow run id, created at submit>"] * len(configs)
    preview = _spec(
        base,
        options,
        preview_dir,
        command,
        options.cwd,
        target.uri,
        placeholder,
        None,
        len(configs) if is_array else None,
    )
    script = render_sbatch(preview, explain=options.explain)
    if options.dry_run:
        return Submitted("", preview_dir.path, None, None, script)

    run_dir = new_run_dir(base.config.job.name, root)
    try:
        return _submit_in(
            run_dir, configs, frozen, chash, is_array, command, options, target, sweep_params
        )
    except NotRecordedError:
        raise
    except BaseException:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise


def _submit_in(
    run_dir: RunDir,
    configs: list[ResolvedConfig],
    frozen: list[str],
    chash: str,
    is_array: bool,
    command: list[str],
    options: SubmitOptions,
    target: Any,
    sweep_params: Sequence[dict[str, str]] | None,
) -> Submitted:
    from stoker.launcher import tracking
    from stoker.launcher.snapshot import snapshot_code

    base = configs[0]
    job = base.config.job
    notes: list[str] = []
    workdir = options.cwd
    code_sha = None
    if options.snapshot:
        snap = snapshot_code(options.code, run_dir.code, cwd=options.cwd)
        if snap is None:
            notes.append(
                f"{options.cwd} is not in a git repository: the job runs there, not from a "
                "snapshot (use --code DIR to snapshot a folder)"
            )
        else:
            workdir = snap.workdir
            code_sha = snap.sha256
            notes += snap.notes

    folders = [run_dir.task(i) for i in range(len(configs))] if is_array else [run_dir]
    for folder, body in zip(folders, frozen, strict=True):
        (folder.logs).mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder.config, body)
    if is_array:
        run_dir.logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir.config, frozen[0])

    cluster = _cluster_name() if not options.local else socket.gethostname()
    tags = {
        "stoker.run_dir": str(run_dir.path),
        "stoker.config_hash": chash,
        "stoker.command": " ".join(command),
        "slurm.cluster": cluster,
        "slurm.nodes": str(job.nodes),
        "slurm.tasks_per_node": str(job.tasks_per_node),
        "slurm.gpus_per_node": str(job.gpus_per_node),
        "slurm.time_limit": job.time,
        "slurm.partition": job.partition or "(default)",
        **({"stoker.code_sha256": code_sha} if code_sha else {}),
        **base.config.tracking.tags,
    }
    run_name = base.config.tracking.run_name or job.name
    parent_run_id: str | None = None
    if is_array:
        children = [
            tracking.ChildSpec(
                run_name=f"{run_name}-{i}",
                params=config_params(cfg),
                tags={
                    **tags,
                    "stoker.run_dir": str(folders[i].path),
                    **{
                        f"sweep.{k}": v for k, v in (sweep_params or [{}] * len(configs))[i].items()
                    },
                },
                artifacts={"config.yaml": frozen[i]},
            )
            for i, cfg in enumerate(configs)
        ]
        parent, child_runs = tracking.precreate_sweep(
            target,
            experiment=base.config.tracking.experiment,
            parent_name=run_name,
            parent_params={"sweep.size": len(configs)},
            parent_tags=tags,
            children=children,
        )
        created = parent
        run_ids = [c.run_id for c in child_runs]
        parent_run_id = parent.run_id
    else:
        created = tracking.precreate_run(
            target,
            experiment=base.config.tracking.experiment,
            run_name=run_name,
            params=config_params(base),
            tags=tags,
            artifacts={"config.yaml": frozen[0]},
        )
        run_ids = [created.run_id]

    spec = _spec(
        base,
        options,
        run_dir,
        command,
        workdir,
        target.uri,
        run_ids,
        parent_run_id,
        len(configs) if is_array else None,
    )
    try:
        script = render_sbatch(spec, explain=False)
        write_text_atomic(run_dir.script, script.text)
        if options.local:
            from stoker.launcher.local_backend import start_local

            job_id = start_local(spec, Ledger())
        else:
            preflight(run_dir.script)
            job_id = sbatch(run_dir.script)
    except BaseException as exc:
        for run_id in dict.fromkeys([created.run_id, *run_ids]):
            # The submit error is the one to show, not a failure to record it.
            with contextlib.suppress(StokerError):
                tracking.mark_run_failed_to_submit(target, run_id, str(exc))
        raise
    record = JobRecord(
        job_id=job_id,
        backend="local" if options.local else "slurm",
        cluster=cluster,
        name=job.name,
        run_dir=str(run_dir.path),
        config_hash=chash,
        template=script.template,
        mlflow_run_id=created.run_id,
        tracking_uri=target.uri,
        array_size=len(configs) if is_array else None,
        extra={
            "command": list(map(str, command)),
            **({"child_run_ids": run_ids} if is_array else {}),
            **({"code_sha256": code_sha} if code_sha else {}),
        },
    )
    try:
        Ledger().add(record)
    except StokerError as exc:
        raise NotRecordedError(
            f"job {job_id} was submitted and will run, but it is not in the job ledger: "
            f"{exc.message}",
            fix=f"follow it with `squeue -j {job_id}` and in its run folder {run_dir.path}; "
            f"{exc.fix or 'check that STOKER_HOME is writable'}",
        ) from exc
    updates: dict[str, tuple[dict[str, str], dict[str, str]]] = {
        created.run_id: ({"job.sbatch": script.text}, {"slurm.job_id": job_id})
    }
    if is_array:
        for index, run_id in enumerate(run_ids):
            updates[run_id] = ({}, {"slurm.job_id": f"{job_id}_{index}"})
    try:
        tracking.update_submitted_runs(target, updates)
    except StokerError as exc:
        raise NotRecordedError(
            f"job {job_id} was submitted and is in the ledger (`stoker status {job_id}`), "
            f"but its MLflow run {created.run_id} lacks the job id and job.sbatch: "
            f"{exc.message}",
            fix=exc.fix,
        ) from exc
    link = tracking.run_link(target, created.experiment_id, created.run_id)
    return Submitted(
        job_id,
        run_dir.path,
        created.run_id,
        link,
        script,
        tuple(run_ids) if is_array else (),
        tuple(notes),
    )


def _spec(
    base: ResolvedConfig,
    options: SubmitOptions,
    run_dir: RunDir,
    command: list[str],
    workdir: Path,
    tracking_uri: str,
    run_ids: Sequence[str],
    parent_run_id: str | None,
    array_size: int | None,
) -> LaunchSpec:
    if options.after is not None and not _AFTER.fullmatch(options.after):
        raise StokerError(
            f"--after {options.after!r} is not a SLURM job id",
            fix="give a job id such as 1234 or 1234_5, several joined with ':'",
        )
    check_stop_grace(base)
    check_eval_data(base)
    check_pass_env(base)
    return LaunchSpec(
        resolved=base,
        run_dir=run_dir.path,
        command=command,
        workdir=workdir,
        tracking_uri=tracking_uri,
        mlflow_run_ids=run_ids,
        parent_run_id=parent_run_id,
        array_size=array_size,
        max_parallel=options.max_parallel,
        after=options.after,
    )


def time_limit_seconds(text: str) -> int | None:
    """sbatch's --time forms in seconds; None for UNLIMITED."""
    if text == "UNLIMITED":
        return None
    days = 0
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        day_text, text = text.split("-", 1)
        days = int(day_text)
        hours, minutes, seconds = [*map(int, text.split(":")), 0, 0][:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:  # a bare number is minutes
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def check_stop_grace(resolved: ResolvedConfig) -> None:
    """The stop signal comes job.stop_grace seconds before the limit: it must fit in it."""
    job = resolved.config.job
    limit = time_limit_seconds(job.time)
    if limit is not None and job.stop_grace >= limit:
        raise StokerError(
            f"job.stop_grace={job.stop_grace} s ({resolved.source_of(('job', 'stop_grace'))}) "
            f"is not shorter than job.time={job.time} ({resolved.source_of(('job', 'time'))}): "
            "the job would be told to save and stop as soon as it starts",
            fix=f"set job.stop_grace below {limit} s (a step plus a checkpoint), "
            f"e.g. job.stop_grace={max(10, limit // 3)}, or give the job more time",
        )


def check_command(command: Sequence[str]) -> None:
    """Each argument goes into the script and the `stoker.command` tag as UTF-8 text."""
    for arg in command:
        try:
            str(arg).encode("utf-8")
        except UnicodeEncodeError:
            raise StokerError(
                f"the command argument {str(arg)!r} is not UTF-8 text",
                fix="pass it in UTF-8 (or through a file the command reads)",
            ) from None


def check_pass_env(resolved: ResolvedConfig) -> None:
    """Every job.pass_env variable is set here: sbatch (and the local backend) hands the
    job this environment, so a missing one would fail the job only once it starts."""
    names = resolved.config.job.pass_env
    missing = [name for name in names if name not in os.environ]
    if missing:
        source = resolved.source_of(("job", "pass_env"))
        verb = "is" if len(missing) == 1 else "are"
        raise StokerError(
            f"job.pass_env ({source}) names {', '.join(missing)}, which {verb} not set in "
            "this environment",
            fix=f"export {missing[0]}=... in this shell before submitting (the job gets it "
            "by name; its value is written nowhere), or remove it from job.pass_env",
        )


def check_eval_data(resolved: ResolvedConfig) -> None:
    """Evaluation needs a held-out set: given (data.eval_url), or made with the
    synthetic training set (data.url null)."""
    cfg = resolved.config
    if cfg.train.eval_every and cfg.data.url is not None and cfg.data.eval_url is None:
        raise StokerError(
            f"train.eval_every={cfg.train.eval_every} "
            f"({resolved.source_of(('train', 'eval_every'))}) but data.eval_url is null: "
            f"there is no held-out data set to evaluate on",
            fix="set data.eval_url to a held-out data set (packed like data.url), "
            "or train.eval_every=0",
        )


def preflight(script: Path) -> None:
    """`sbatch --test-only`: SLURM judges the request (partition, limits, GRES) up front."""
    from stoker.launcher.slurm_cli import SlurmError

    try:
        run_slurm(["sbatch", "--test-only", str(script)])
    except SlurmError as exc:
        raise StokerError(
            f"SLURM refused the job: {_sbatch_message(exc.stderr)}",
            fix="change the resources (job.* keys or flags) to what the cluster offers; "
            "`stoker doctor` lists partitions and their limits. Nothing was submitted",
        ) from exc


def sbatch(script: Path) -> str:
    out = run_slurm(["sbatch", "--parsable", str(script)])
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise StokerError(f"sbatch printed {out.strip()!r}, not a job id")
    return job_id


def _sbatch_message(stderr: str) -> str:
    lines = [line.removeprefix("sbatch: error: ").strip() for line in stderr.splitlines()]
    return "; ".join(line for line in lines if line) or "no reason given"


def _cluster_name() -> str:
    out = run_slurm(["scontrol", "show", "config"])
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return "unknown"
