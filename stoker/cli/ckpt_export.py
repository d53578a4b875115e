"""`stoker ckpt export`: one weights file for inference from a sharded checkpoint."""

from __future__ import annotations

import typer


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
        False, "--full", help="Verify every file's sha256 first (reads every byte)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Write the model weights of a committed checkpoint as one file, unsharded.

    The checkpoint must be committed and verify (sizes; every sha256 with
    --full). Only the model's tensors are read, by their plain FQNs
    (blocks.0.attn.qkv.weight), so the file loads into an unwrapped model with
    load_state_dict(strict=True). OUT is replaced whole or not at all.

    Example: stoker ckpt export s3://bucket/runs/exp1/checkpoints model.safetensors --dtype bf16
    """
    from stoker.checkpoint.export import export_weights
    from stoker.cli.ckpt_root import checkpoint_path
    from stoker.cli.output import note, print_json

    result = export_weights(
        checkpoint_path(path),
        out,
        fmt=fmt,  # type: ignore[arg-type]  # checked there, with the fix
        dtype=dtype,
        verify="full" if full else "quick",
        force=force,
        warn=lambda message: note(f"warning: {message}"),
    )
    if as_json:
        print_json(result.to_dict())
        return
    typer.echo(
        f"step-{result.step}: {result.tensors} tensors, {result.bytes} bytes "
        f"({', '.join(result.dtypes)}, {result.format}) -> {result.out}"
    )
