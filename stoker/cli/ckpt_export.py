"""`stoker ckpt export`: one weights file for inference from a sharded checkpoint."""

from __future__ import annotations

import typer

from stoker.plural import plural


def export(
    path: str = typer.Argument(
        ...,
        metavar="PATH",
        help="One checkpoint folder (step-<N>), or a checkpoint root (or a job id: its root): "
        "its newest that verifies.",
    ),
    out: str = typer.Argument(
        ..., metavar="OUT", help="The file to write (local path, s3://, ...)."
    ),
    fmt: str = typer.Option(
        "safetensors", "--format", help="safetensors, or torch (torch.save of the state dict)."
    ),
    dtype: str | None = typer.Option(
        None, "--dtype", help="bf16, fp16 or fp32: cast floating tensors. Default: as saved."
    ),
    full: bool = typer.Option(
        False,
        "--full",
        help="Verify every file's sha256 first, not only those it reads (reads every byte).",
    ),
    ema: bool = typer.Option(
        False, "--ema", help="The EMA weights (train.ema_decay) in place of the trained ones."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    register: str | None = typer.Option(
        None,
        "--register",
        metavar="NAME",
        help="Then add OUT as the next version of registered model NAME in MLflow's model "
        "registry, its lineage (run, COMMIT.json digest, data sets, samples) as tags.",
    ),
    tracking_uri: str | None = typer.Option(
        None,
        "--tracking-uri",
        help="The MLflow store for --register (default: the store of the run that saved "
        "the checkpoint, as its COMMIT.json records it; else $MLFLOW_TRACKING_URI, else "
        "stoker's own).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Write the model weights of a committed checkpoint as one file, unsharded.

    The checkpoint must be committed and verify: sizes, and the sha256 of every
    file it reads (every file's with --full). Only the model's tensors are read, by their plain FQNs
    (blocks.0.attn.qkv.weight), so the file loads into an unwrapped model with
    load_state_dict(strict=True). OUT is replaced whole or not at all.

    With --register NAME the file becomes the next version of NAME in MLflow's
    model registry, uploaded as a logged model of the run that saved the
    checkpoint; the version's tags name that run, the sha256 of the checkpoint's
    COMMIT.json, the run's data sets' digests and its samples at that step.

    Example: stoker ckpt export s3://bucket/runs/exp1/checkpoints model.safetensors --dtype bf16
    """
    from stoker.checkpoint.export import export_weights
    from stoker.cli.ckpt_root import checkpoint_path
    from stoker.cli.output import note, print_json

    if tracking_uri is not None and register is None:
        from stoker.errors import StokerError

        raise StokerError(
            "--tracking-uri names the store for --register, which is not given",
            fix="add --register NAME, or drop --tracking-uri",
        )
    if register is not None:
        from stoker.tracking.limits import check_registered_model_name
        from stoker.tracking.store import resolve_tracking_uri

        # Before the export, which may read GBs: a bad name or URI fails at once.
        check_registered_model_name(register)
        resolve_tracking_uri(tracking_uri)
    result = export_weights(
        checkpoint_path(path),
        out,
        fmt=fmt,  # type: ignore[arg-type]  # checked there, with the fix
        dtype=dtype,
        verify="full" if full else "quick",
        force=force,
        weights="ema" if ema else "model",
        warn=lambda message: note(f"warning: {message}"),
    )
    registered = None
    if register is not None:
        from stoker.checkpoint.origin import read_origin
        from stoker.tracking.model_registry import WEIGHTS_TAG, register_version

        origin = read_origin(result.source)
        if tracking_uri is None:
            # The store the job that saved it logged to (passwords hidden: credentials
            # come from MLFLOW_TRACKING_USERNAME/PASSWORD), where its run and lineage are.
            recorded = origin.facts.get("tracking_uri")
            tracking_uri = recorded if isinstance(recorded, str) and recorded else None
        registered = register_version(
            register,
            result.out,
            checkpoint_url=origin.folder,
            step=origin.step,
            run_id=origin.mlflow_run_id,
            commit_sha256=origin.commit_sha256,
            tracking_uri=tracking_uri,
            extra_tags={WEIGHTS_TAG: "ema" if ema else "model"},
        )
        if registered.missing:
            note(
                f"warning: registered without lineage: {', '.join(registered.missing)} "
                "(tag stoker.lineage.missing)"
            )
    if as_json:
        data = result.to_dict()
        if registered is not None:
            data["registered"] = registered.to_dict()
        print_json(data)
        return
    typer.echo(
        f"step-{result.step}: {plural(result.tensors, 'tensor')}, {plural(result.bytes, 'byte')} "
        f"({', '.join(result.dtypes)}, {result.format}) -> {result.out}"
    )
    if registered is not None:
        run = f" from run {registered.run_id}" if registered.run_id else ""
        typer.echo(f"registered {registered.name} version {registered.version}{run}")
