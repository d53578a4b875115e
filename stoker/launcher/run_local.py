"""`stoker run`: submit an experiment to the local backend (the same launch as
`stoker submit --local`), follow rank 0's log to its end, and say where the
results are.

The built-in experiment (stoker/runtime/tiny.yaml)
trains the tiny AV diffusion transformer on a synthetic data set, which is
written here, before the ranks start, on first use.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.errors import StokerError
from stoker.tracking.store import tracking_off

if TYPE_CHECKING:
    from stoker.config import ResolvedConfig
    from stoker.launcher.why import Diagnosis

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    job_id: str
    run_id: str | None
    run_dir: Path
    state: str
    exit_code: int
    step: int | None
    loss: float | None
    # Why it did not complete (`stoker why`'s diagnosis); None for a completed job.
    diagnosis: Diagnosis | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "state": self.state,
            "exit_code": self.exit_code,
            "step": self.step,
            "loss": self.loss,
            "diagnosis": self.diagnosis.to_json() if self.diagnosis else None,
        }


def builtin_experiment() -> Path:
    return Path(str(resources.files("stoker.runtime") / "tiny.yaml"))


def builtin_arch() -> str:
    import yaml

    return str(yaml.safe_load(builtin_experiment().read_text())["model"]["arch"])


def builtin_with_own_model(resolved: ResolvedConfig) -> ResolvedConfig:
    """The built-in experiment with another model (`model.arch=pkg.mod:build` or
    `model.arch=audio_ar` given on the command line): its data and schedule stay, its
    settings for its own model do not. Its `model.args` (the tiny av_dit's patch and
    objective) are dropped, those given on the command line kept, so that another factory
    is not handed keywords it never declared. For a model of the user's own, its samples
    (train.sample_every) fall back to the default, so that the user hears of sampling only
    when they ask for it, and the job (its run folder, its name in MLflow) is named after
    the model's package, not `tiny`."""
    from stoker.config import ExperimentConfig
    from stoker.config.resolve import DEFAULT
    from stoker.launcher.launch.job_name import MODEL_SOURCE, model_package

    def from_builtin(key: tuple[str, ...]) -> bool:
        return resolved.source_of(key).where.startswith(f"{builtin_experiment()}:")

    if from_builtin(("model", "arch")) or resolved.config.model.arch == builtin_arch():
        return resolved  # its own model (`model.arch=av_dit` given again included)
    config, sources = resolved.config, dict(resolved.sources)
    builtin_args = {key for key in sources if key[:2] == ("model", "args") and from_builtin(key)}
    if builtin_args:
        kept = {
            name: value
            for name, value in config.model.args.items()
            if ("model", "args", name) not in builtin_args
        }
        config = config.model_copy(update={"model": config.model.model_copy(update={"args": kept})})
        for key in builtin_args:
            del sources[key]
    arch = config.model.arch
    if ":" not in arch:
        return dataclasses.replace(resolved, config=config, sources=sources)
    if from_builtin(("train", "sample_every")):
        default = ExperimentConfig().train.sample_every
        config = config.model_copy(
            update={"train": config.train.model_copy(update={"sample_every": default})}
        )
        sources[("train", "sample_every")] = DEFAULT
    if from_builtin(("job", "name")):
        package = model_package(arch)
        config = config.model_copy(update={"job": config.job.model_copy(update={"name": package})})
        sources[("job", "name")] = MODEL_SOURCE
    return dataclasses.replace(resolved, config=config, sources=sources)


def default_nproc() -> int:
    """One rank per GPU; two on a CPU machine (gloo, one core each on 2 cores)."""
    return local_gpus() or 2


# The device nodes an NVIDIA (nvidiactl) or AMD (kfd) driver creates; CUDA_VISIBLE_DEVICES
# cannot show a GPU to a machine without one.
_GPU_DRIVER_NODES = (Path("/dev/nvidiactl"), Path("/dev/kfd"))


def local_gpus() -> int:
    """The GPUs torch sees here. On a machine without a GPU driver, 0 without importing
    torch (1.5-2 CPU-s at every `stoker run`, on login nodes and laptops alike);
    with one, torch counts them, CUDA_VISIBLE_DEVICES and ROCm included."""
    if not any(node.exists() for node in _GPU_DRIVER_NODES):
        return 0
    import torch

    return int(torch.cuda.device_count())


def run_here(
    experiment: Path | None,
    overrides: Sequence[str],
    *,
    nproc: int | None,
    command: Sequence[str] = (),
    profile: Path | None,
    use_profile: bool,
    say: Say,
    echo: Say,
) -> RunResult:
    from stoker.config import resolve_config
    from stoker.launcher.jobs.rundir import RunDir
    from stoker.launcher.jobs.targets import resolve_job
    from stoker.launcher.launch.checks import check_launch
    from stoker.launcher.launch.local_inputs import check_local_inputs
    from stoker.launcher.launch.model_fit import check_model_fits
    from stoker.launcher.launch.submit import SubmitOptions, submit
    from stoker.launcher.local.backend import cancel_local
    from stoker.launcher.local.state import read_local_state
    from stoker.launcher.watch.logs import LogFilter, LogReader, follow, job_state
    from stoker.launcher.why import diagnose

    ranks = nproc or default_nproc()
    gpus = local_gpus()
    if gpus and ranks > gpus:
        raise StokerError(
            f"--nproc {ranks} asks for more ranks than this machine's {gpus} GPUs",
            fix=f"--nproc {gpus} or fewer",
        )
    flags = {
        "job.nodes": (1, "--nproc"),
        "job.ntasks_per_node": (ranks, "--nproc"),
        "job.gpus_per_node": (ranks if gpus else 0, "--nproc"),
    }
    resolved = resolve_config(
        experiment or builtin_experiment(),
        list(overrides),
        flags,
        profile=profile,
        use_profile=use_profile,
    )
    if experiment is None:
        resolved = builtin_with_own_model(resolved)
    # The checks submit makes, first: a refused run writes no data set.
    check_launch(resolved, None)
    check_local_inputs(resolved, command, Path.cwd())
    if not command:
        # Before a data set is written or a rank started: does the model take the data?
        check_model_fits(resolved, say=say)
        if resolved.config.data.url is None and not resolved.config.data.sources:
            from stoker.data.synthetic.default_set import ensure_synthetic_data

            ensure_synthetic_data(resolved.config.data, progress=say)
    # The model was checked above, before the synthetic data set; a command of the
    # user's own (a loop using stoker.job) has no model stoker knows of.
    submitted = submit(resolved, SubmitOptions(local=True, check=False, command=list(command)))
    run = RunDir(submitted.run_dir)
    say(f"job {submitted.job_id}: {ranks} local ranks, run folder {run.path}")
    target = resolve_job(submitted.job_id)
    reader = LogReader(run, LogFilter(rank=0, batch=False), echo)
    try:
        follow(reader, lambda: job_state(target).ended)
    except KeyboardInterrupt:
        cancel_local(run.path)
        say(f"stopped job {submitted.job_id}")
        raise
    local = read_local_state(run)
    state = local.state if local else "UNKNOWN"
    code = local.exit_code if local and local.exit_code is not None else 1
    progress = _progress(run.progress)
    # The first failing rank may not be rank 0, whose log was followed: say why here.
    diagnosis = diagnose(target) if state != "COMPLETED" else None
    if diagnosis is not None:
        from stoker.launcher.jobs.ledger import Ledger
        from stoker.launcher.watch.job_end import Ended, ended_reasons

        ended_reasons(Ledger(), [Ended(target, state)], {target.job_id: diagnosis})
    result = RunResult(
        submitted.job_id,
        submitted.run_id,
        run.path,
        state,
        code,
        progress.get("step"),
        progress.get("loss"),
        diagnosis,
    )
    checkpoints = resolved.config.checkpoint.root or str(run.path / "checkpoints")
    _say_where(
        result,
        submitted.run_link,
        checkpoints,
        say,
        tracked=not tracking_off(resolved.config.tracking.uri),
    )
    return result


def _stoker_command() -> str:
    """`stoker` where that name runs this stoker; else the path of this one (`make run`
    does not put .venv/bin on PATH)."""
    import shutil
    import sys

    me = Path(sys.argv[0])
    if me.name != "stoker":
        return "stoker"
    found = shutil.which("stoker")
    if found and Path(found).resolve() == me.resolve():
        return "stoker"
    return shlex.quote(str(me.absolute()))


def _progress(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _say_where(
    result: RunResult, link: str | None, checkpoints: str, say: Say, *, tracked: bool = True
) -> None:
    done = f"at step {result.step}, loss {result.loss:.4f}" if result.loss is not None else ""
    if result.diagnosis is None:  # else the diagnosis, printed after, says how it ended
        say(f"job {result.job_id} {result.state.lower()} {done}".rstrip())
    say(f"run folder: {result.run_dir}")
    if result.step:
        say(f"checkpoints: {checkpoints} (`stoker ckpt ls {result.job_id}`)")
    if not tracked:  # tracking.uri none
        from stoker.tracking.file_logger import METRICS_FILE

        say(f"metrics: {result.run_dir / METRICS_FILE} (tracking.uri is none: no MLflow)")
        return
    if link:
        say(f"MLflow: {link}")
    say(f"`{_stoker_command()} ui` opens the MLflow UI on this store (`make ui` in a clone)")
