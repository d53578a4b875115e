"""`stoker bench kernels`: each kernel against torch eager, torch.compile and
Liger-Kernel, with GB/s and % of the measured copy bandwidth."""

from __future__ import annotations

from pathlib import Path

import typer

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _ints(text: str, option: str) -> list[int]:
    from stoker.errors import StokerError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise StokerError(
            f"{option} {text!r} is not a comma-separated list of positive integers",
            fix=f"for example {option} 4096,16384",
        )
    return values


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def kernels(
    names: str = typer.Option(
        "all",
        "--kernels",
        help="Comma-separated: rms_norm, add_rms_norm, modulated_rms_norm, swiglu, geglu, "
        "rope, cross_entropy; or all.",
    ),
    tokens: str = typer.Option("4096,16384,65536", "--tokens", help="Token counts (rows)."),
    hidden: str = typer.Option("1024,2048,3072,4096", "--hidden", help="Hidden sizes."),
    vocab: str = typer.Option(
        "8192,32768,65536", "--vocab", help="Cross-entropy classes (rows x classes <= 2^31)."
    ),
    modes: str = typer.Option("fwd,bwd,fwd+bwd", "--modes", help="fwd, bwd, fwd+bwd."),
    baselines: str = typer.Option(
        "eager,compile,compile_max_autotune,liger",
        "--baselines",
        help="eager, compile, compile_max_autotune, liger (skipped when not installed).",
    ),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    reps: int = typer.Option(30, "--reps", min=1, help="Timed repeats (the median is kept)."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed calls first."),
    device: str = typer.Option(
        "auto", "--device", help="auto (the GPU if any), cuda, cuda:N or cpu (harness check)."
    ),
    out: Path = typer.Option(
        Path("benchmarks/results"), "--out", help="Folder for kernels-<gpu>-<date>.json."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result document as JSON."),
) -> None:
    """Time every kernel in fwd, bwd and fwd+bwd against its baselines.

    Rows are added to OUT/kernels-<gpu>-<date>.json (rows of earlier runs the
    same day for other kernels or shapes are kept). On a CPU the harness runs
    (the reference path, for checking it), but only GPU times mean anything.

    Example: stoker bench kernels --kernels rms_norm,swiglu --tokens 16384 --hidden 4096
    """
    from stoker.errors import StokerError

    if dtype not in _DTYPES:
        raise StokerError(f"--dtype {dtype!r} is not one of bf16, fp16, fp32", fix="--dtype bf16")
    import torch

    from stoker.cli.bench_device import parse_device
    from stoker.cli.output import out as console
    from stoker.cli.output import print_json
    from stoker.kernels import KernelBackendError
    from stoker.kernels.bench import cases, run

    chosen = list(cases.CASES) if names == "all" else _names(names)
    dev = parse_device(device)
    if dev.type == "cpu":
        from stoker.cli.output import note

        # Said first: on a CPU this takes minutes, and the figures are no speed.
        note(
            "note: no GPU here: the Triton kernels run in the interpreter, so this only checks "
            "the harness (it may take minutes); the times and ratios say nothing about speed. "
            "Run it on a GPU node for figures."
        )
    progress = None if as_json else (lambda row: console().print(run.format_row(row), markup=False))
    try:
        result = run.run(
            chosen,
            tokens=_ints(tokens, "--tokens"),
            hidden=_ints(hidden, "--hidden"),
            vocab=_ints(vocab, "--vocab"),
            modes=_names(modes),
            baselines=_names(baselines),
            dtype=getattr(torch, _DTYPES[dtype]),
            device=dev,
            warmup=warmup,
            reps=reps,
            progress=progress,
        )
    except KernelBackendError as exc:
        raise StokerError(exc.message, fix=exc.fix) from exc
    except ValueError as exc:
        raise StokerError(str(exc), fix="see stoker bench kernels --help") from exc
    path = run.write_result(result, out)
    if as_json:
        print_json({**result, "path": str(path)})
        return
    console().print(f"copy bandwidth {result['copy_gbps']:.0f} GB/s on {result['device']}")
    for name, s in result["summary"].items():
        console().print(
            f"fwd+bwd vs {name}: geomean {s['fwd_bwd_geomean']:.2f}x, "
            f"min {s['fwd_bwd_min']:.2f}x over {s['rows']} rows"
        )
    console().print(f"wrote {path}")
