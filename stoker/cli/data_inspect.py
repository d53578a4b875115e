"""`stoker data inspect`: what a data set holds, from its manifest and indexes."""

from __future__ import annotations

from pathlib import Path

import typer

from stoker.plural import plural


def inspect(
    url: str = typer.Argument(..., metavar="URL", help="Data set root (folder, s3://, ...)."),
    frames: int = typer.Option(
        3, "--frames", help="Write the middle frame of this many samples as PNG (0: none)."
    ),
    frames_dir: Path | None = typer.Option(
        None,
        "--frames-dir",
        help="Folder for the PNG frames (default: a new temporary folder, named in the output).",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    suggest_buckets: bool = typer.Option(
        False,
        "--suggest-buckets",
        help="Propose data.buckets from the sizes and durations, with each one's share.",
    ),
    max_side: int = typer.Option(
        256, "--max-side", min=16, help="With --suggest-buckets: the longest frame side."
    ),
) -> None:
    """Shards, samples, durations, codecs, sizes and rates of a data set, and its digest;
    a few frames as PNG, into --frames-dir or a new temporary folder (never the
    current folder unasked), whose name it prints.

    The digest (16 hex digits of the shards' paths, checksums and sample counts) is the
    data set's identity, as a run records it among its MLflow dataset inputs. Reads the
    manifest and every shard index (small files), and the bytes of the samples whose
    frames it writes; never lists the store.

    --suggest-buckets proposes buckets of the most common aspect ratios (longer side
    at most --max-side and never larger than the data, multiples of 16) at clip
    lengths most samples hold, as YAML to paste under `data:` (batch sizes are
    yours: give each a batch_size, or set data.batch_tokens).

    Example: stoker data inspect s3://bucket/av --frames 4 --frames-dir /tmp/look
    """
    from stoker.cli.output import note, out, print_json
    from stoker.data.inspect_dataset import inspect_dataset

    if frames and frames_dir is None:
        import tempfile

        # Never into the current folder unasked: a folder of its own, said below.
        frames_dir = Path(tempfile.mkdtemp(prefix="stoker-frames-"))
    report = inspect_dataset(
        url,
        frames=frames,
        frames_dir=frames_dir if frames else None,
        suggest_buckets=max_side if suggest_buckets else None,
    )
    if frames:
        written = len(report["frames_written"])
        note(
            f"wrote {written} frame{'' if written == 1 else 's'} to {frames_dir} "
            "(--frames-dir DIR to choose the folder, --frames 0 for none)"
        )
    if as_json:
        print_json(report)
        return
    _print_report(report, out())
    if suggest_buckets:
        out().print(_buckets_yaml(report["suggested_buckets"]), markup=False, highlight=False)


def _buckets_yaml(rows: list[dict]) -> str:  # type: ignore[type-arg]
    """The suggestion as YAML for an experiment file, each bucket's share as a comment."""
    lines = ["# suggested buckets (share of the samples each would get):", "buckets:"]
    for row in rows:
        fields = [f"clip_seconds: {row['clip_seconds']:g}"]
        if "resolution" in row:
            height, width = row["resolution"]
            fields.insert(0, f"resolution: [{height}, {width}]")
        lines.append(f"  - {{{', '.join(fields)}}}  # {row['share']:.0%}")
    return "\n".join(lines)


def _print_report(r: dict, console: object) -> None:  # type: ignore[type-arg]
    from rich.table import Table

    def spread(d: dict, unit: str = "", fmt: str = "g") -> str:  # type: ignore[type-arg]
        if not d:
            return "-"
        return " / ".join(f"{d[k]:{fmt}}{unit}" for k in ("min", "median", "max"))

    table = Table(title=f"{r['url']} ({r['format']})", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("digest", r["digest"]),
        ("samples", f"{r['samples']} in {plural(r['shards'], 'shard')}"),
        ("size", f"{r['bytes'] / 1e6:.1f} MB"),
        ("duration", f"{r['duration_s'] / 3600:.2f} h ({r['duration_s']:g} s)"),
        ("modalities", ", ".join(r["modalities"]) or "-"),
        ("members", ", ".join(r["fields"]) or "-"),
        ("sample s (min/median/max)", spread(r["sample_duration_s"], " s")),
        ("shard MB (min/median/max)", spread(_mb(r["shard_bytes"]), fmt=".1f")),
        ("video", _fmt_counts(r["video"], ("codecs", "sizes", "fps"))),
        ("keyframe every (frames)", spread(r["video"]["keyframe_interval"])),
        ("audio", _fmt_counts(r["audio"], ("codecs", "sample_rates", "channels"))),
        ("frames written", "\n".join(r["frames_written"]) or "-"),
    ]
    latents = r.get("latents")
    if latents:
        encoder = latents["encoder"]
        rows += [
            ("encoder", f"{encoder['factory']} {encoder['args'] or ''} ({encoder['digest'][:12]})"),
            ("lineage", "\n-> ".join(latents["lineage"])),
        ]
        for bucket, row in latents["buckets"].items():
            tensors = ", ".join(f"{n} {shape}" for n, shape in row["tensors"].items())
            rows.append((f"latents {bucket}", f"{plural(row['samples'], 'sample')}: {tensors}"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)  # type: ignore[attr-defined]


def _mb(spread: dict) -> dict:  # type: ignore[type-arg]
    return {k: v / 1e6 for k, v in spread.items()}


def _fmt_counts(section: dict, keys: tuple[str, ...]) -> str:  # type: ignore[type-arg]
    if not section["samples"]:
        return "-"
    parts = []
    for key in keys:
        unit = _UNITS.get(key, "")
        # "8 fps (32 samples)": the value with its unit, and how many samples have it.
        parts.append(", ".join(f"{_number(k)}{unit} ({n})" for k, n in section[key].items()))
    return f"{plural(section['samples'], 'sample')}: " + "; ".join(parts)


_UNITS = {"fps": " fps", "sample_rates": " Hz", "channels": " ch"}


def _number(value: object) -> str:
    """8.0 -> "8", 29.97 -> "29.97"; other values as they are."""
    try:
        return f"{float(str(value)):g}"
    except ValueError:
        return str(value)
