"""`stoker data encode SRC DST --encoder pkg.mod:factory`: latents of a data set, once
(stoker/data/encode/pipeline.py); with --slurm, as a job array through stoker's launcher
(stoker/launcher/launch/data_array.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from stoker.plural import plural

if TYPE_CHECKING:
    from stoker.data.encode.shard import DecodeSpec


def encode(
    src: str = typer.Argument(..., metavar="SRC", help="The data set to encode (its root URL)."),
    dst: str = typer.Argument(..., metavar="DST", help="Folder or fsspec URL of the latents."),
    settings: list[str] = typer.Argument(
        None,
        metavar="[data.KEY=VALUE ...]",
        help="Decode settings over the experiment's: data.resolution=[128,128] "
        "data.clip_seconds=2 data.modalities=[video] data.buckets=[...]. Clip length, fps "
        "and size not set here or in --experiment follow the source's clips.",
        show_default=False,
    ),
    encoder: str = typer.Option(
        ...,
        "--encoder",
        "-e",
        help="The encoder factory, package.module:function, imported by name "
        "(stoker.data.tiny_encoder:build is stoker's own).",
    ),
    args: list[str] = typer.Option(
        [],
        "--args",
        "-a",
        help="A keyword argument of the factory, NAME=VALUE (VALUE read as YAML); repeat it.",
    ),
    experiment: Path | None = typer.Option(
        None,
        "--experiment",
        "-x",
        help="Take the decode settings (data.*) from this experiment file.",
        show_default=False,
    ),
    batch_size: int = typer.Option(8, "--batch-size", "-b", min=1, help="Clips per encoder call."),
    workers: int = typer.Option(
        1, "--workers", "-w", min=1, help="Local processes, each with its own encoder."
    ),
    device: str | None = typer.Option(
        None, "--device", help="cpu or cuda; default: a GPU when there is one.", show_default=False
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Discard what DST holds and encode it all again."
    ),
    slurm: bool = typer.Option(
        False, "--slurm", help="Encode in a SLURM job array; returns with its job id."
    ),
    tasks: int | None = typer.Option(
        None,
        "--tasks",
        min=1,
        help="With --slurm: array tasks (default: one per shard, at most 100).",
        show_default=False,
    ),
    partition: str | None = typer.Option(
        None, "--partition", "-p", help="With --slurm: the partition.", show_default=False
    ),
    time: str | None = typer.Option(
        None,
        "--time",
        help="With --slurm: each task's time limit (sbatch's forms).",
        show_default=False,
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", min=0, help="With --slurm: GPUs of each task.", show_default=False
    ),
    cpus_per_task: int | None = typer.Option(
        None,
        "--cpus-per-task",
        min=1,
        help="With --slurm: CPU cores of each task (decoding).",
        show_default=False,
    ),
    mem: str | None = typer.Option(
        None, "--mem", help="With --slurm: memory of each task (e.g. 32G).", show_default=False
    ),
    max_parallel: int | None = typer.Option(
        None,
        "--max-parallel",
        min=1,
        help="With --slurm: array tasks running at once.",
        show_default=False,
    ),
    wait: bool = typer.Option(False, "--wait", help="With --slurm: follow the job to its end."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary as the last line."),
) -> None:
    """Encode a data set with your encoder (a video VAE, an audio codec, a text encoder)
    into a latent data set that training streams without decoding.

    Output shard n holds the latents of source shard n: one `<key>.latent.safetensors`
    per sample (the encoder's tensors by name) plus its caption and metadata. The
    manifest names the encoder (factory, arguments, code and weights digests) and the
    source (URL, manifest digest): encoding into a folder made by another encoder or
    from another source is refused. Running the same command again encodes only the
    shards not finished; a clip the encoder fails on is skipped and reported.

    Clips are decoded at the source's clip length, frame rate and size (what `data
    pack` recorded in its indexes) unless data.clip_seconds, data.fps or
    data.resolution (here or in --experiment) say otherwise; the settings used, and
    where each came from, are printed first.

    Example: stoker data encode ./av ./av-latents -e stoker.data.tiny_encoder:build
    """
    from stoker.cli.array_wait import refuse_slurm_flags
    from stoker.cli.output import err, note
    from stoker.data.encode.encoder_api import parse_encoder_args
    from stoker.data.encode.pipeline import EncodeRequest
    from stoker.launcher.launch.job_flags import JobFlags, command_line

    slurm_flags = JobFlags(
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
    )
    given = {"--tasks": tasks, **slurm_flags.given(command_line)}
    refuse_slurm_flags(slurm, {**given, "--max-parallel": max_parallel, "--wait": wait}, "encode")
    decode, decode_sources = decode_settings(experiment, settings or [], src)
    note(describe_decode(decode, decode_sources))
    request = EncodeRequest(
        src=src,
        dst=dst,
        factory=encoder,
        args=parse_encoder_args(args),
        decode=decode,
        batch_size=batch_size,
        workers=workers,
        restart=restart,
        device=device,
    )
    if slurm:
        from stoker.launcher.launch.data_array import ArrayOptions, submit_encode

        options = ArrayOptions(tasks=tasks, slurm=slurm_flags, max_parallel=max_parallel)
        submitted = submit_encode(request, options)
        if submitted is None:
            note("every shard is already encoded: nothing to submit")
            _finish_local(request, as_json)
            return
        _report_submitted(submitted, as_json and not wait)
        if wait:
            from stoker.cli.array_wait import wait_for_array

            wait_for_array(submitted.job_id)
            _finish_local(request, as_json)
        return

    from stoker.cli.data_pack import _BarProgress, _NoteProgress
    from stoker.data.encode.pipeline import run_encode

    if err().is_terminal:
        with _BarProgress() as progress:
            report = run_encode(request, progress)
    else:
        report = run_encode(request, _NoteProgress())
    busy = report.encode_seconds / report.seconds if report.seconds else 0.0
    gpu = f", GPU {report.gpu_util:.0f}% busy" if report.gpu_util is not None else ""
    note(
        f"encoded {plural(report.encoded_samples, 'clip')} in {report.written} of "
        f"{plural(report.planned, 'shard')} "
        f"in {report.seconds:.1f} s: {report.clips_per_s:.2f} clips/s, encoder busy "
        f"{busy:.0%} of the time{gpu}"
    )
    _print_report({**report.summary(), "decode": decode_json(decode, decode_sources)}, as_json)


FROM_SOURCE = "the source's clips"
"""Where a decode setting came from when the source's clips decided it."""


def decode_settings(
    experiment: Path | None, settings: list[str], src: str
) -> tuple[DecodeSpec, dict[str, str]]:
    """The decode settings: the experiment's data.* (the built-in defaults without one)
    with `settings` (data.KEY=VALUE) over them, and the source's clip length, fps and
    size where neither sets them; with where each of those three came from."""
    from stoker.config import resolve_config
    from stoker.config.resolve import DEFAULT
    from stoker.data.encode.shard import DecodeSpec
    from stoker.data.encode.source_clips import source_clips
    from stoker.data.sets.buckets import Bucket
    from stoker.errors import StokerError

    for item in settings:
        if not item.startswith("data."):
            raise StokerError(
                f"{item!r} is not a data.KEY=VALUE decode setting",
                fix="give decode settings as data.resolution=[128,128]; the encoder's own "
                "arguments as --args NAME=VALUE",
            )
    resolved = resolve_config(experiment, settings)
    data = resolved.config.data
    clips = source_clips(src)
    followed = {
        "clip_seconds": clips.clip_seconds,
        "fps": clips.fps,
        "resolution": clips.resolution,
    }
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, from_source in followed.items():
        given = resolved.source_of(("data", key))
        if given == DEFAULT and from_source is not None:
            chosen[key], sources[key] = from_source, FROM_SOURCE
        else:
            chosen[key], sources[key] = getattr(data, key), str(given)
    modalities = tuple(m for m in data.modalities if m in ("video", "audio", "text"))
    if not {"video", "audio"} & set(modalities):
        raise StokerError(
            f"data.modalities {list(data.modalities)} has neither video nor audio to encode",
            fix="data.modalities=[video,audio] (or one of them)",
        )
    resolution = (chosen["resolution"][0], chosen["resolution"][1])
    spec = DecodeSpec(
        modalities=modalities,
        fps=float(chosen["fps"]),
        resolution=resolution,
        clip_seconds=float(chosen["clip_seconds"]),
        sample_rate=data.sample_rate,
        channels=data.channels,
        resize=data.resize,
        buckets=tuple(
            Bucket(tuple(b.resolution or resolution), float(b.clip_seconds), 1)
            for b in data.buckets
        ),
    )
    return spec, sources


def describe_decode(spec: DecodeSpec, sources: dict[str, str]) -> str:
    """The decode settings as the encode reports them, with where each came from."""
    height, width = spec.resolution
    shape = (
        f"{len(spec.buckets)} buckets ({', '.join(b.name for b in spec.buckets)})"
        if spec.buckets
        else f"{spec.clip_seconds:g} s clips at {spec.fps:g} fps, {height}x{width} ({spec.resize})"
    )
    audio = f", audio {spec.sample_rate} Hz x{spec.channels}" if "audio" in spec.modalities else ""
    origins = ", ".join(
        f"data.{key} from {where}"
        for key, where in sources.items()
        if not (spec.buckets and key == "clip_seconds")
    )
    return (
        f"decoding {'+'.join(spec.modalities)} as {shape}{audio} ({origins}; "
        "data.KEY=VALUE overrides)"
    )


def decode_json(spec: DecodeSpec, sources: dict[str, str]) -> dict[str, Any]:
    """The decode settings for --json, with where the followed ones came from."""
    return {
        "clip_seconds": spec.clip_seconds,
        "fps": spec.fps,
        "resolution": list(spec.resolution),
        "resize": spec.resize,
        "sample_rate": spec.sample_rate,
        "channels": spec.channels,
        "modalities": list(spec.modalities),
        "buckets": [b.name for b in spec.buckets],
        "sources": sources,
    }


def _finish_local(request: Any, as_json: bool) -> None:
    """After a SLURM encode ended: the manifest (when every shard is there) and the report."""
    from stoker.data.encode.pipeline import finalize, read_skipped
    from stoker.data.encode.plan import load_plan
    from stoker.data.write.location import open_location
    from stoker.errors import StokerError

    manifest = finalize(request.dst)
    fs, root, _ = open_location(request.dst)
    plan = load_plan(fs, root)
    assert plan is not None
    if manifest is None:
        from stoker.data.write.shard_set import finished_shards

        done = len(finished_shards(fs, root, range(plan.shards)))
        raise StokerError(
            f"the encode of {request.dst} ended with {done} of {plural(plan.shards, 'shard')} "
            "encoded",
            fix="`stoker why JOB` shows what failed; run the same command again to encode the rest",
        )
    summary = {
        "samples": manifest.samples,
        "shards": len(manifest.shards),
        "skipped": read_skipped(fs, root, plan.shards),
        "manifest": f"{request.dst.rstrip('/')}/manifest.json",
        "encoder_identity": plan.encoder.digest,
    }
    _print_report(summary, as_json)


def _report_submitted(submitted: Any, as_json: bool) -> None:
    from stoker.cli.output import note, out

    out().print(f"submitted encode job {submitted.job_id}", markup=False)
    note(f"`stoker status {submitted.job_id}` follows it; `stoker logs {submitted.job_id}` its log")
    if as_json:
        import json

        sys.stdout.write(json.dumps(submitted.as_json()) + "\n")


def _print_report(summary: dict[str, Any], as_json: bool) -> None:
    from stoker.cli.output import out

    if as_json:
        import json

        sys.stdout.write(json.dumps(summary) + "\n")
        return
    out().print(
        f"{plural(summary['samples'], 'sample')} in {plural(summary['shards'], 'shard')}: "
        f"{summary['manifest']}",
        markup=False,
    )
    skipped = summary["skipped"]
    if skipped:
        out().print(f"skipped {plural(len(skipped), 'sample')}:", markup=False)
        for row in skipped:
            out().print(f"  {row['shard']}:{row['key']}: {row['reason']}", markup=False)
