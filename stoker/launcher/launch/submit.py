"""`stoker submit` and `stoker sweep`: from a resolved experiment to a queued SLURM job.

Order matters, so that a failure loses nothing and leaves nothing half-done:
validate → run folder → code snapshot → frozen config(s) → MLflow run(s) → render →
`sbatch --test-only` → `sbatch --parsable` → ledger. A refusal by SLURM marks the
MLflow run failed and removes the run folder; no job runs from an invalid config.
With `tracking.uri: none` no MLflow run is made (the job writes metrics.jsonl in its
run folder instead) and mlflow is not imported.

`submit` checks and freezes what it was given into a `SubmitRequest`, renders the
script once as a last check (and the answer of a dry run), then `_submit_in` creates
things, one step per call.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import importlib.util
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.atomic_write import write_bytes_atomic, write_text_atomic
from stoker.config import ResolvedConfig, freeze_config
from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.rundir import RunDir, new_run_dir, runs_root
from stoker.launcher.launch.checks import (
    check_command,
    check_launch,
    check_partition_fits,
    check_run_root,
    check_same_job,
)
from stoker.launcher.launch.job_name import named_after_command, named_after_experiment
from stoker.launcher.script.render import RenderedScript, Shell, render_sbatch
from stoker.launcher.script.spec import LaunchSpec
from stoker.launcher.slurm.cli import run_slurm
from stoker.protocol import TRAIN_MODULE, runs_the_runtime
from stoker.tracking.runs import (
    ChildSpec,
    CreatedRun,
    config_params,
    mark_run_failed_to_submit,
    precreate_run,
    precreate_sweep,
    run_link,
    update_submitted_runs,
)
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri, tracking_off


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
    check: bool = True
    """Build the model on the meta device and run its forward before anything is
    created (training runtime jobs; `--no-check` skips it)."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Files written into the run folder before the job is queued, by relative path
    (a function job's pickled call)."""


@dataclass(frozen=True)
class SubmitRequest:
    """One submission, checked and frozen, before anything is created."""

    configs: tuple[ResolvedConfig, ...]
    """One per task of a job array; one for a single job."""
    frozen: tuple[str, ...]
    """Each config's frozen YAML, as its task reads it."""
    config_digest: str
    """`frozen_config_digest(frozen)`: in the ledger and the MLflow tag `stoker.config_hash`."""
    is_array: bool
    """A job array (`stoker sweep`), whatever its number of tasks."""
    command: tuple[str, ...]
    """The argv every task runs; items may be `render.Shell`."""
    options: SubmitOptions
    runs_root: Path
    """The folder the run folder is made in (checked: SLURM can write logs there)."""
    tracking: TrackingTarget | None
    """The MLflow store the runs are created in, and the job logs into; None for
    tracking.uri none (no runs)."""
    sweep_params: tuple[Mapping[str, str], ...]
    """Each task's swept values, tagged `sweep.<key>` on its run; `{}` for a single job."""

    @property
    def base(self) -> ResolvedConfig:
        """The first task's config: job.*, tracking.* and the script come from it."""
        return self.configs[0]

    @property
    def array_size(self) -> int | None:
        return len(self.configs) if self.is_array else None


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


@dataclass(frozen=True)
class _Code:
    """Where the tasks run: the snapshot's folder, or the current folder without one."""

    workdir: Path
    sha256: str | None
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Runs:
    """The MLflow runs made for a job."""

    created: CreatedRun | None
    """The job's run: a single job's, or a sweep's parent; None without MLflow."""
    task_run_ids: list[str]
    """The run each task logs into (a single job's run, or a sweep's children); ""
    for each task without MLflow."""
    parent_run_id: str | None

    @property
    def run_id(self) -> str | None:
        return self.created.run_id if self.created is not None else None

    @property
    def all_ids(self) -> list[str]:
        return [i for i in dict.fromkeys([self.run_id or "", *self.task_run_ids]) if i]


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


def check_models(request: SubmitRequest) -> None:
    """The model check of stoker/launcher/launch/model_fit.py for a runtime job, once per
    distinct model and data settings of its configs (a sweep over the learning rate
    checks once). Not for a container job: its Python, not this one, imports the model."""
    if not runs_the_runtime(list(request.command)) or request.base.config.job.container:
        return
    from stoker.launcher.launch.model_fit import check_model_fits

    seen: set[str] = set()
    for resolved in request.configs:
        cfg = resolved.config
        key = cfg.model.model_dump_json() + cfg.data.model_dump_json()
        if key not in seen:
            seen.add(key)
            check_model_fits(resolved, cwd=request.options.cwd)


def check_inputs(request: SubmitRequest) -> None:
    """What each task reads from this machine's file systems (stoker/launcher/launch/
    local_inputs.py). A job that waits for another (`--after`) may read what that one
    writes: only its script is checked."""
    from stoker.launcher.launch.local_inputs import check_local_inputs, check_script

    options = request.options
    folder = _code_folder(options)
    if options.after is not None:
        in_container = request.base.config.job.container is not None
        check_script(request.command, folder, in_container=in_container)
        return
    for resolved in request.configs:
        check_local_inputs(resolved, request.command, folder)


def _code_folder(options: SubmitOptions) -> Path:
    """The folder whose snapshot the tasks run from: the current one, or `--code DIR`
    when the current folder is outside it."""
    cwd = options.cwd.absolute()
    if options.code is None or not options.snapshot:
        return cwd
    code = options.code.expanduser().absolute()
    return cwd if cwd.resolve().is_relative_to(code.resolve()) else code


def frozen_config_digest(frozen_bodies: Sequence[str]) -> str:
    """SHA-256 (64 hex digits) of the frozen configs' values, comments left out: equal
    digests, equal experiments. Not `stoker.config.state_hash`, which checkpoints keep."""
    digest = hashlib.sha256()
    for body in frozen_bodies:
        # The header carries a time stamp; the digest is of the values only.
        digest.update(
            "".join(line for line in body.splitlines(True) if not line.startswith("#")).encode()
        )
    return digest.hexdigest()


def submit(
    resolved: ResolvedConfig | Sequence[ResolvedConfig],
    options: SubmitOptions,
    *,
    sweep_params: Sequence[Mapping[str, str]] | None = None,
) -> Submitted:
    """Submit one job, or one job array when given several configs (a sweep).

    Returns at once with the job id; with `dry_run` nothing is created or submitted
    and `job_id` is empty.
    """
    request = _request(resolved, options, sweep_params)
    # The cheap checks first (stat calls, one sinfo), then the model's (up to a minute).
    # --no-check skips what is checked from here (a /scratch only the nodes see).
    if options.check and not options.dry_run:
        check_inputs(request)
    if not options.dry_run and not options.local:
        check_partition_fits(request.base)
    if options.check and not options.dry_run:
        check_models(request)
    # Rendered before anything is created, for a dry run and as the last check of a
    # real one: a template or setup line that fails here leaves no run folder or MLflow run.
    name = request.base.config.job.name
    preview_dir = RunDir(request.runs_root / f"{name}-<time>-<id>")
    placeholder = ["<MLflow run id, created at submit>" if request.tracking else ""] * len(
        request.configs
    )
    preview = _spec(request, preview_dir, options.cwd, placeholder, None)
    script = render_sbatch(preview, explain=options.explain)
    if options.dry_run:
        return Submitted("", preview_dir.path, None, None, script)

    run_dir = new_run_dir(name, request.runs_root)
    try:
        return _submit_in(request, run_dir)
    except NotRecordedError:
        raise
    except BaseException:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        raise


def _request(
    resolved: ResolvedConfig | Sequence[ResolvedConfig],
    options: SubmitOptions,
    sweep_params: Sequence[Mapping[str, str]] | None,
) -> SubmitRequest:
    """Check what was given and freeze the configs; creates nothing."""
    is_array = not isinstance(resolved, ResolvedConfig)
    configs = (resolved,) if isinstance(resolved, ResolvedConfig) else tuple(resolved)
    command = task_command(configs[0], options)
    if options.command:
        configs = named_after_command(configs, command)
    configs = named_after_experiment(configs)
    check_command(command)
    check_same_job(configs)
    root = runs_root()
    check_run_root(root)
    frozen = tuple(freeze_config(cfg) for cfg in configs)
    return SubmitRequest(
        configs=configs,
        frozen=frozen,
        config_digest=frozen_config_digest(frozen),
        is_array=is_array,
        command=tuple(command),
        options=options,
        runs_root=root,
        tracking=_tracking_target(configs[0].config.tracking.uri),
        sweep_params=tuple(sweep_params or [{}] * len(configs)),
    )


def _tracking_target(uri: str | None) -> TrackingTarget | None:
    return None if tracking_off(uri) else resolve_tracking_uri(uri)


def _submit_in(request: SubmitRequest, run_dir: RunDir) -> Submitted:
    """Create the job in `run_dir`, step by step. A failure before the job is queued
    raises, once its MLflow runs exist after marking them failed (the caller removes
    the run folder); a failure to record a queued job raises NotRecordedError, and
    the job runs."""
    code = _snapshot(request, run_dir)
    folders = _write_configs(request, run_dir)
    for relative, data in request.options.files.items():
        write_bytes_atomic(run_dir.path / relative, data)
    cluster = socket.gethostname() if request.options.local else _cluster_name()
    runs = _create_runs(request, folders, _run_tags(request, run_dir, cluster, code))
    spec = _spec(request, run_dir, code.workdir, runs.task_run_ids, runs.parent_run_id)
    try:
        script = render_sbatch(spec, explain=False)
        write_text_atomic(run_dir.script, script.text)
        job_id = _queue(request, run_dir, spec)
    except BaseException as exc:
        for run_id in runs.all_ids:
            assert request.tracking is not None  # runs exist only with a store
            # The submit error is the one to show, not a failure to record it.
            with contextlib.suppress(StokerError):
                mark_run_failed_to_submit(request.tracking, run_id, str(exc))
        raise
    _record_in_ledger(request, run_dir, job_id, cluster, script, runs, code)
    _record_in_runs(request, job_id, script, runs)
    link = None
    if request.tracking is not None and runs.created is not None:
        link = run_link(request.tracking, runs.created.experiment_id, runs.created.run_id)
    return Submitted(
        job_id,
        run_dir.path,
        runs.run_id,
        link,
        script,
        tuple(runs.task_run_ids) if request.is_array else (),
        code.notes,
    )


def _snapshot(request: SubmitRequest, run_dir: RunDir) -> _Code:
    """The code snapshot in the run folder, unless --no-snapshot or outside git."""
    from stoker.launcher.launch.snapshot import snapshot_code

    options = request.options
    if not options.snapshot:
        return _Code(options.cwd, None, ())
    snap = snapshot_code(options.code, run_dir.code, cwd=options.cwd)
    if snap is None:
        note = (
            f"{options.cwd} is not in a git repository: the job runs there, not from a "
            "snapshot (use --code DIR to snapshot a folder)"
        )
        return _Code(options.cwd, None, (note,))
    return _Code(snap.workdir, snap.sha256, tuple(snap.notes))


def _write_configs(request: SubmitRequest, run_dir: RunDir) -> list[RunDir]:
    """Each task's frozen config (and logs folder); a job array's folders, one per task."""
    if request.is_array:
        folders = [run_dir.task(i) for i in range(len(request.configs))]
    else:
        folders = [run_dir]
    for folder, body in zip(folders, request.frozen, strict=True):
        folder.logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder.config, body)
    if request.is_array:
        run_dir.logs.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir.config, request.frozen[0])
    return folders


def _run_tags(request: SubmitRequest, run_dir: RunDir, cluster: str, code: _Code) -> dict[str, str]:
    """The tags of the job's MLflow run(s); the experiment's tracking.tags last."""
    config = request.base.config
    job = config.job
    return {
        "stoker.run_dir": str(run_dir.path),
        "stoker.config_hash": request.config_digest,  # the tag keeps its first name
        "stoker.command": " ".join(request.command),
        "slurm.cluster": cluster,
        "slurm.nodes": str(job.nodes),
        "slurm.tasks_per_node": str(job.tasks_per_node),
        "slurm.gpus_per_node": str(job.gpus_per_node),
        "slurm.time_limit": job.time,
        "slurm.partition": job.partition or "(default)",
        **({"stoker.code_sha256": code.sha256} if code.sha256 else {}),
        **config.tracking.tags,
    }


def _create_runs(request: SubmitRequest, folders: list[RunDir], tags: dict[str, str]) -> _Runs:
    """The job's MLflow run, with the config as params and config.yaml as artifact;
    for a job array, a parent run and one child run per task."""
    base = request.base.config
    run_name = base.tracking.run_name or base.job.name
    if request.tracking is None:  # tracking.uri none
        return _Runs(None, [""] * len(request.configs), None)
    if not request.is_array:
        created = precreate_run(
            request.tracking,
            experiment=base.tracking.experiment,
            run_name=run_name,
            params=config_params(request.base),
            tags=tags,
            artifacts={"config.yaml": request.frozen[0]},
        )
        return _Runs(created, [created.run_id], None)
    children = [
        ChildSpec(
            run_name=f"{run_name}-{i}",
            params=config_params(cfg),
            tags={
                **tags,
                "stoker.run_dir": str(folders[i].path),
                **{f"sweep.{k}": v for k, v in request.sweep_params[i].items()},
            },
            artifacts={"config.yaml": request.frozen[i]},
        )
        for i, cfg in enumerate(request.configs)
    ]
    parent, child_runs = precreate_sweep(
        request.tracking,
        experiment=base.tracking.experiment,
        parent_name=run_name,
        parent_params={"sweep.size": len(request.configs)},
        parent_tags=tags,
        children=children,
    )
    return _Runs(parent, [c.run_id for c in child_runs], parent.run_id)


def _spec(
    request: SubmitRequest,
    run_dir: RunDir,
    workdir: Path,
    run_ids: Sequence[str],
    parent_run_id: str | None,
) -> LaunchSpec:
    """What the renderer takes, after the checks the script depends on."""
    check_launch(request.base, request.options.after)
    return LaunchSpec(
        resolved=request.base,
        run_dir=run_dir.path,
        command=list(request.command),
        workdir=workdir,
        tracking_uri=request.tracking.uri if request.tracking is not None else "",
        mlflow_run_ids=run_ids,
        parent_run_id=parent_run_id,
        array_size=request.array_size,
        max_parallel=request.options.max_parallel,
        after=request.options.after,
    )


def _queue(request: SubmitRequest, run_dir: RunDir, spec: LaunchSpec) -> str:
    """Start the job: `sbatch --test-only`, then `sbatch`; or the local backend. Its id."""
    if request.options.local:
        from stoker.launcher.local.backend import start_local

        return start_local(spec, Ledger())
    preflight(run_dir.script)
    return sbatch(run_dir.script)


def _record_in_ledger(
    request: SubmitRequest,
    run_dir: RunDir,
    job_id: str,
    cluster: str,
    script: RenderedScript,
    runs: _Runs,
    code: _Code,
) -> None:
    """The ledger's record of the queued job (`stoker status`, `logs`, `why`, `cancel`)."""
    record = JobRecord(
        job_id=job_id,
        backend="local" if request.options.local else "slurm",
        cluster=cluster,
        name=request.base.config.job.name,
        run_dir=str(run_dir.path),
        config_digest=request.config_digest,
        template=script.template,
        mlflow_run_id=runs.run_id,
        tracking_uri=request.tracking.uri if request.tracking is not None else None,
        array_size=request.array_size,
        extra={
            "command": list(map(str, request.command)),
            "user": getpass.getuser(),
            **({"child_run_ids": runs.task_run_ids} if request.is_array else {}),
            **({"code_sha256": code.sha256} if code.sha256 else {}),
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


def _record_in_runs(
    request: SubmitRequest, job_id: str, script: RenderedScript, runs: _Runs
) -> None:
    """The job id on the MLflow run(s) (each task's on its child), the script as a param."""
    if request.tracking is None or runs.created is None:
        return
    updates: dict[str, tuple[dict[str, str], dict[str, str]]] = {
        runs.created.run_id: ({"job.sbatch": script.text}, {"slurm.job_id": job_id})
    }
    if request.is_array:
        for index, run_id in enumerate(runs.task_run_ids):
            updates[run_id] = ({}, {"slurm.job_id": f"{job_id}_{index}"})
    try:
        update_submitted_runs(request.tracking, updates)
    except StokerError as exc:
        raise NotRecordedError(
            f"job {job_id} was submitted and is in the ledger (`stoker status {job_id}`), "
            f"but its MLflow run {runs.created.run_id} lacks the job id and job.sbatch: "
            f"{exc.message}",
            fix=exc.fix,
        ) from exc


def preflight(script: Path) -> None:
    """`sbatch --test-only`: SLURM judges the request (partition, limits, GRES) up front."""
    from stoker.launcher.slurm.cli import SlurmError

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
