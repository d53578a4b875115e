"""`stoker sample`: clips from a checkpoint, in one process, on a GPU or the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from stoker.config import ExperimentConfig

CONFIG_NAME = "config.yaml"  # a run folder's frozen config (stoker.config.frozen)


def sample(
    source: str = typer.Argument(
        ...,
        metavar="CHECKPOINT_OR_RUN",
        help="A job id, a run folder, a checkpoint root, or one step-<N> folder: the "
        "newest checkpoint that verifies.",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="The folder to write (replaced whole)."),
    seeds: list[int] = typer.Option(
        [], "--seed", help="A seed per clip (repeat it); default: the run's train.sample_seeds."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Solver steps per clip; default: train.sample_steps."
    ),
    method: str | None = typer.Option(
        None, "--method", help="euler or heun; default: train.sample_method."
    ),
    prompts: list[str] = typer.Option(
        [],
        "--prompt",
        help="A conditioned model's caption or class label, one per seed "
        "(repeat it; one is used for every seed); default: unconditioned.",
    ),
    guidance: float = typer.Option(
        1.0, "--cfg", min=0.0, help="Classifier-free guidance weight with --prompt; 1: none."
    ),
    weights: str = typer.Option(
        "auto", "--weights", help="ema, model, or auto (the EMA's where the run kept one)."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The experiment that trained it, for a checkpoint that carries no "
        "config.yaml (saved by an older stoker) outside a run folder.",
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu, cuda, cuda:1; default: the GPU where there is one."
    ),
    log: bool = typer.Option(
        False,
        "--log",
        help="Also add the clips to the checkpoint's MLflow run, under samples/cli-step-<N>/.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Draw clips from a checkpoint of any world size: an mp4 (H.264 + AAC) or a WAV
    per seed, a contact sheet and samples.json, into OUT.

    The model is rebuilt from the run's frozen config (the run folder's config.yaml,
    or --config) and takes the checkpoint's weights whole, in this one process: the
    same seed gives the same files.

    Examples: stoker sample 1234 --seed 0 --seed 1 --steps 50 --out clips/
              stoker sample runs/exp1 --prompt "a red circle" --cfg 4 --out red/
    """
    from stoker.cli.output import err, print_json
    from stoker.errors import StokerError

    if weights not in ("auto", "ema", "model"):
        raise StokerError(
            f"--weights {weights!r} is not ema, model or auto",
            fix="--weights ema, --weights model, or leave it out",
        )
    url, cfg = _checkpoint_and_config(source, config)
    method = method or cfg.train.sample_method
    if method not in ("euler", "heun"):
        raise StokerError(f"--method {method!r} is not euler or heun", fix="--method heun")
    import torch
    from rich.progress import Progress

    from stoker.runtime.sampling.from_checkpoint import sample_checkpoint

    steps = steps or cfg.train.sample_steps
    seeds = seeds or cfg.train.sample_seeds
    if prompts and len(prompts) not in (1, len(seeds)):
        raise StokerError(
            f"{len(prompts)} --prompt for {len(seeds)} seeds",
            fix="give one --prompt, or one per --seed",
        )
    per_seed = [prompts[i % len(prompts)] for i in range(len(seeds))] if prompts else None
    console = err()
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("sampling", total=None)
        result = sample_checkpoint(
            cfg,
            url,
            out,
            seeds=seeds,
            steps=steps,
            method=method,  # type: ignore[arg-type]  # checked above
            weights=weights,  # type: ignore[arg-type]  # checked above
            device=torch.device(device) if device else None,
            on_step=lambda done, total: bar.update(task, completed=done, total=total),
            prompts=per_seed,
            guidance=guidance,
        )
    logged = _log(result.checkpoint, cfg, out, result.step) if log else None
    record: dict[str, Any] = {
        "step": result.step,
        "checkpoint": result.checkpoint,
        "weights": result.weights,
        "out": str(result.out),
        "files": [p.name for p in result.files],
        "logged": logged,
    }
    if as_json:
        print_json(record)
        return
    typer.echo(
        f"step-{result.step} ({result.weights} weights): "
        f"{', '.join(record['files'])} -> {result.out}"
    )
    if logged:
        typer.echo(f"logged to MLflow: {logged}")


def _checkpoint_and_config(source: str, config: Path | None) -> tuple[str, ExperimentConfig]:
    """The checkpoint URL SOURCE stands for, and the experiment that trained it."""
    from stoker.config import resolve_config
    from stoker.errors import StokerError

    url: str | None = source  # None: the run's checkpoint root
    run_dir: Path | None = None
    if "://" in source:
        pass
    elif Path(source).exists():
        path = Path(source).resolve()
        # A run folder, its checkpoint root, or a step-<N> folder under it (which holds a
        # config.yaml of its own, beside its COMMIT.json: not a run folder).
        run_dir = next(
            (
                p
                for p in (path, path.parent, path.parent.parent)
                if (p / CONFIG_NAME).is_file() and not (p / "COMMIT.json").exists()
            ),
            None,
        )
        if run_dir == path:
            url = None
    else:
        from stoker.launcher.jobs.ledger import Ledger

        record = Ledger().get(source)
        if record is None:
            raise StokerError(
                f"{source!r} is neither a path nor a job id this machine submitted",
                fix="pass a job id (`stoker status` lists them), a run folder, or a "
                "checkpoint folder",
            )
        run_dir, url = Path(record.run_dir), None
    experiment = config or (run_dir / CONFIG_NAME if run_dir is not None else None)
    if experiment is None:
        assert url is not None
        return url, _config_it_carries(url)
    cfg = resolve_config(experiment, use_profile=False).config
    if url is None:
        assert run_dir is not None
        url = cfg.checkpoint.root or str(run_dir / "checkpoints")
    return url, cfg


def _config_it_carries(url: str) -> ExperimentConfig:
    """The frozen experiment a checkpoint outside any run folder carries."""
    from stoker.checkpoint.origin import saved_description
    from stoker.cli.ckpt_root import carried_config

    return carried_config(
        saved_description(url), fix="pass the experiment file that trained it with --config"
    )


def _log(checkpoint: str, cfg: ExperimentConfig, out: Path, step: int) -> str:
    """Add `out`'s files to the MLflow run that saved `checkpoint`; where they went."""
    from stoker.checkpoint.origin import saved_run_id
    from stoker.errors import StokerError
    from stoker.tracking.store import open_store, resolve_tracking_uri

    run_id = saved_run_id(checkpoint)
    if run_id is None:
        raise StokerError(
            f"--log: checkpoint {checkpoint!r} names no MLflow run (saved without tracking)",
            fix="leave out --log; the clips are in --out",
        )
    target = resolve_tracking_uri(cfg.tracking.uri)
    artifact_path = f"samples/cli-step-{step}"
    with open_store(target, None) as (client, _):
        client.log_artifacts(run_id, str(out), artifact_path)
    return f"runs:/{run_id}/{artifact_path}"
