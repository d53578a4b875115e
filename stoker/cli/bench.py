"""`stoker bench`: benchmarks with roofline figures. One module per command."""

from __future__ import annotations

import typer

from stoker.cli import bench_kernels, bench_step

app = typer.Typer(
    help="Benchmarks: Triton kernels against torch eager, torch.compile and Liger-Kernel.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.command("kernels")(bench_kernels.kernels)
app.command("step")(bench_step.step)
