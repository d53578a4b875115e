"""`stoker data`: write, pack, inspect and benchmark AV data sets. One module per command."""

from __future__ import annotations

import typer

from stoker.cli import data_bench, data_encode, data_inspect, data_pack, data_synth

app = typer.Typer(
    help="AV data sets: synthesize, pack media into shards, encode latents, inspect, "
    "benchmark the loader.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.command("synth")(data_synth.synth)
app.command("pack")(data_pack.pack)
app.command("encode")(data_encode.encode)
app.command("inspect")(data_inspect.inspect)
app.command("bench")(data_bench.bench)
