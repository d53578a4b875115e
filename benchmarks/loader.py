"""How fast StreamingLoader delivers decoded clips, against webdataset on the same
shards with the same decode, and how close its video decoder comes to plain PyAV;
for a plain stream, a bucketed one and a mixture; and what streaming latents of the
same clips buys (the latents stream).

    python benchmarks/loader.py [--streams plain,bucketed,mixed,latents] [--clips 256]
        [--seconds 4] [--size 128x128] [--fps 24] [--batch 16] [--clip-seconds 2]
        [--out-fps 8] [--out-size 128x128] [--workers 1,2] [--epochs 3] [--repeats 3]
        [--decode-clips 64] [--latent-epochs 30] [--encode-workers 1] [--data DIR]
        [--out DIR] [--out-name FILE]

Writes synthetic data sets (stoker.data.synthetic.shapes: H.264 with a keyframe a second, and
FLAC) into a temporary folder, or reads the packed data set at --data (a local
folder) for the plain and latents streams, and times each stream
(benchmarks/loader_streams.py, benchmarks/loader_latents.py):

plain: --clips clips of --seconds at --size, batches of --batch.
bucketed: the square (128x128, 4 s), wide (96x160, 3 s) and tall (160x96, 2 s) sets,
    --clips each, as one data set of plain WebDataset tars; a bucket per shape, at its
    own size: square and wide --clip-seconds clips in batches of --batch, tall clips
    half as long in batches twice as large.
mixed: the square and wide sets, weights 2:1, every clip centre-cropped to
    --out-size, batches of --batch.
latents: the plain stream's data set, and the latent data set `run_encode` makes of
    it with the tiny encoder (stoker.data.tiny_encoder:build, --encode-workers
    processes; its clips/s and encoder share reported) at --out-fps, --out-size and
    --clip-seconds, from each clip's start. Three pipelines in batches of --batch, with
    clip_offset "start" (the clip an encode takes): raw (StreamingLoader decoding
    video + audio, --epochs a run), latents (StreamingLoader, modalities ("latent",),
    --latent-epochs a run: a latent sample costs little) and webdataset on the latent
    shards (.shuffle(64).map(safetensors.torch.load of latent.safetensors).batched,
    the same DataLoader settings). Runs alternate raw / latents / webdataset; reported
    per worker count: samples/s, per worker and per CPU-second of each, latents / raw
    (target >= 10: what encoding once must save) and latents / webdataset (target
    >= 1.0 in samples/s and in samples/CPU-s), medians over repeats of adjacent runs'
    ratios. Checked: the tiny encoder
    run here on the raw loader's clips gives the latent loader's tensors, and
    webdataset's equal the latent loader's, for the same keys. No decode efficiency.

loader throughput: samples/s of StreamingLoader (random clip offsets, shuffled) and
    of the webdataset pipeline a user would write for the same stream (named in the
    printout and the result), in a torch DataLoader with the same workers, start
    method and prefetch. Its map calls the same decode_video and decode_audio with
    the same parameters, at the clip start StreamingLoader used for that sample: both
    do the same decode work (checked: clips decoded by both must be equal, and with
    buckets each sample in its bucket). A run is about --epochs epochs; the time to
    its first batch (worker start-up, first fetches) is reported apart, and the rate
    counts the samples after it. Runs alternate stoker / webdataset so that load from
    other processes hits both alike; the ratio is the median over repeats of stoker /
    webdataset in adjacent runs. Target: >= 1.0 at every worker count, every stream.

decode efficiency: in this process, on --decode-clips clip spans of each stream
    (starts on the source frame grid, its bucket's length), source frames of the
    spans per CPU second (so per core) of decode_video asked for the same frames as
    plain PyAV gives (every source frame of the span, RGB at the source size; checked
    equal), against plain PyAV: av.open, seek to the keyframe before the span, decode
    at the source rate with one decoder thread, frame.to_ndarray(format="rgb24") for
    each frame of the span. Plain PyAV runs as written ("naive": swscale then starts a
    thread pool for every frame), with threads=1 for the conversion ("tuned"), and
    tuned plus a copy to decode_video's (T, 3, H, W) layout. Every decoder runs on a
    span before the next span. Efficiency is the median over spans and repeats of
    plain PyAV's CPU time on a span over decode_video's, against plain PyAV giving the
    same output as decode_video (tuned, to (T, 3, H, W) uint8 at the source size).
    Target: >= 0.9, every stream. Printed beside it, with no target: the efficiency
    against the faster of naive and tuned in PyAV's own (T, H, W, 3) layout, which
    leaves out the copy to the layout a training step takes.
    decode_video at the loader's parameters (--out-fps, the stream's output size) is
    timed on the same spans too.

Also reported: the loader's output frames/s per worker, the decode threads each worker
took (data.decode_threads' default: the cores the workers leave, stoker/data/stream/prefetch.py),
the decode seconds per worker-second (LoaderStats video_frames, decode_s; summed over
the threads) and bytes read per sample. Writes
the result to DIR/loader-<host>-<date>.json (or DIR/FILE); exits 1 when a target is
missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.loader_decode import DECODE_TARGET, measure_decode, print_decode
from benchmarks.loader_latents import (
    LATENTS,
    LATENTS_OVER_RAW_TARGET,
    LatentsBench,
    encode_info,
    encode_latents,
    time_latents,
)
from benchmarks.loader_runs import RATIO_TARGET, Run, print_throughput, summarize
from benchmarks.loader_stream_bench import Clip, StreamBench
from benchmarks.loader_streams import (
    MIXTURE,
    SETS,
    SQUARE,
    STREAMS,
    BucketedStream,
    MixedStream,
    PlainStream,
    merge_as_plain_tars,
    set_buckets,
    write_sets,
)
from benchmarks.machine import machine_info

if TYPE_CHECKING:
    from stoker.data.sets.source import DataSource


def parse_size(text: str) -> tuple[int, int] | None:
    if text.lower() == "none":
        return None
    height, _, width = text.lower().partition("x")
    return int(height), int(width)


ALL_STREAMS = (*STREAMS, LATENTS)


def parse_streams(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in ALL_STREAMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown streams {unknown or names}: choose from {','.join(ALL_STREAMS)}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--streams", type=parse_streams, default=list(ALL_STREAMS), help="which streams to time"
    )
    parser.add_argument("--data", help="a packed data set (local folder) for the plain stream")
    parser.add_argument("--clips", type=int, default=256, help="clips of each synthetic set")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", type=parse_size, default=(128, 128), help="HxW of the source")
    parser.add_argument("--fps", type=int, default=24, help="source frame rate")
    parser.add_argument("--sample-rate", type=int, default=16000)
    parser.add_argument("--per-shard", type=int, default=16, help="samples per shard")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", default="1,2", help="DataLoader worker counts")
    parser.add_argument("--clip-seconds", type=float, default=2.0)
    parser.add_argument("--out-fps", type=float, default=8.0)
    parser.add_argument("--out-size", type=parse_size, default=(128, 128), help="HxW or none")
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3, help="epochs a run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decode-clips", type=int, default=64, help="spans of each stream")
    parser.add_argument("--decode-repeats", type=int, default=5)
    parser.add_argument(
        "--latent-epochs", type=int, default=30, help="epochs a latent run (latents stream)"
    )
    parser.add_argument(
        "--encode-workers", type=int, default=1, help="processes of the latents stream's encode"
    )
    parser.add_argument("--start-method", default="forkserver", choices=("forkserver", "spawn"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--out-name", help="the result's file name (default loader-HOST-DATE.json)")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]
    if "mixed" in args.streams and args.out_size is None:
        parser.error("--out-size none: the mixed stream batches two shapes, so needs one size")
    if LATENTS in args.streams and args.out_size is None:
        parser.error("--out-size none: the latents stream encodes clips of one size")

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-loader-"))
    streams: dict[str, dict[str, Any]] = {}
    try:
        benches, raw = build_streams(args, work)
        for bench in benches:
            streams[bench.name] = time_stream(bench, args, worker_counts)
        if LATENTS in args.streams:
            assert raw is not None
            streams[LATENTS] = time_latents_stream(raw, args, work, worker_counts)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary = {name: summary_row(s) for name, s in streams.items()}
    machine = machine_info()
    result: dict[str, Any] = {
        "benchmark": "loader",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "targets": {
            "samples_per_s_ratio": RATIO_TARGET,
            "decode_efficiency": DECODE_TARGET,
            "latents_over_raw": LATENTS_OVER_RAW_TARGET,
        },
        "summary": summary,
        "streams": streams,
    }
    print_summary(summary)
    args.out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    path = args.out / (args.out_name or f"loader-{machine['host']}-{now:%Y-%m-%d}.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    void = [name for name, row in summary.items() if not row["same_output"]]
    if void:
        print(f"the two pipelines decoded different clips in {', '.join(void)}: void there")
        return 1
    return 0 if all(row["meets_targets"] for row in summary.values()) else 1


def summary_row(stream: dict[str, Any]) -> dict[str, Any]:
    """A stream's line in the result's summary."""
    rows = stream["throughput"]
    row = {"ratio": {str(r["workers"]): r["ratio"] for r in rows}}
    if "decode" in stream:
        row["decode_efficiency"] = stream["decode"]["efficiency"]
        row["decode_efficiency_pyav_layout"] = stream["decode"]["efficiency_vs_pyav_layout"]
    else:  # latents
        row["latents_over_raw"] = {str(r["workers"]): r["latents_over_raw"] for r in rows}
        row["cpu_ratio"] = {str(r["workers"]): r["cpu_ratio"] for r in rows}
        row["encode_clips_per_s"] = stream["encode"]["clips_per_s"]
    return {
        **row,
        "same_output": stream["same_output"]["ok"],
        "meets_targets": all(stream["meets_targets"].values()),
    }


def build_streams(
    args: argparse.Namespace, work: Path
) -> tuple[list[StreamBench], DataSource | None]:
    """The streams asked for, with their data written (or opened) under `work`; and the
    plain stream's data set, which the latents stream encodes (None without either)."""
    from stoker.data.sets.dataset import open_dataset
    from stoker.data.synthetic.shapes import synth_dataset

    cores = os.cpu_count() or 1
    options = {"seed": args.seed, "epochs": args.epochs, "start_method": args.start_method}
    out: list[StreamBench] = []
    plain: DataSource | None = None
    if {"plain", LATENTS} & set(args.streams):
        url = args.data
        if not url:
            url = str(work / "set")
            print(f"writing {args.clips} clips x {args.seconds:g} s at {args.size} {args.fps} fps")
            began = time.perf_counter()
            synth_dataset(
                url,
                clips=args.clips,
                seconds=args.seconds,
                size=args.size,
                fps=args.fps,
                sample_rate=args.sample_rate,
                samples_per_shard=args.per_shard,
                seed=args.seed,
                workers=cores,
            )
            print(f"  {time.perf_counter() - began:.1f} s")
        plain = open_dataset(url)
        if "file" not in plain.fs.protocol:
            raise SystemExit(f"--data {url}: webdataset reads local shards here; copy it locally")
        first = plain.read_index(0).samples[0]
        if first.video is None or first.audio is None:
            raise SystemExit(f"{url}: the benchmark needs samples with video and audio")
        clip = stream_clip(args, args.out_size, first.video.field, first.audio.field)
        if "plain" in args.streams:
            out.append(PlainStream(plain, clip, args.batch, **options))
    if not {"bucketed", "mixed"} & set(args.streams):
        return out, plain

    # The square set is the plain stream's when that is the same synthetic set.
    same = (tuple(args.size), args.seconds) == (SQUARE.size, SQUARE.seconds)
    square = plain if plain is not None and not args.data and same else None
    specs = [s for s in SETS if not (square is not None and s is SQUARE)]
    print(f"writing {args.clips} clips each of {', '.join(s.name for s in specs)}")
    began = time.perf_counter()
    urls = write_sets(
        work / "sets",
        specs,
        clips=args.clips,
        fps=args.fps,
        sample_rate=args.sample_rate,
        per_shard=args.per_shard,
        seed=args.seed,
        workers=cores,
    )
    sets = {name: open_dataset(url) for name, url in urls.items()}
    if square is not None:
        sets = {SQUARE.name: square, **sets}
    print(f"  {time.perf_counter() - began:.1f} s")
    clip = stream_clip(
        args, args.out_size, "mp4", "flac"
    )  # what stoker.data.synthetic.shapes writes
    if "bucketed" in args.streams:
        began = time.perf_counter()
        merge_as_plain_tars(sets, work / "bucketed")
        source = open_dataset(str(work / "bucketed"))  # indexes the tars, probing each member
        print(
            f"bucketed data set: {source.manifest.samples} samples in plain tars, indexed in "
            f"{time.perf_counter() - began:.1f} s"
        )
        buckets = set_buckets(SETS, args.clip_seconds, args.batch)
        out.append(BucketedStream(source, clip, buckets, sets, **options))
    if "mixed" in args.streams:
        mixture = [(name, sets[name], weight) for name, weight in MIXTURE]
        out.append(MixedStream(mixture, clip, args.batch, **options))
    return out, plain


def time_latents_stream(
    raw: DataSource, args: argparse.Namespace, work: Path, worker_counts: list[int]
) -> dict[str, Any]:
    """Encode the plain stream's data set with the tiny encoder, then time raw against
    latents and latents against webdataset (benchmarks/loader_latents.py)."""
    first = raw.read_index(0).samples[0]
    assert first.video is not None and first.audio is not None
    clip = stream_clip(args, args.out_size, first.video.field, first.audio.field)
    print(
        f"encoding {raw.manifest.samples} clips with the tiny encoder, "
        f"{args.encode_workers} process(es)"
    )
    latents, report = encode_latents(raw, work / "latents", clip, args.batch, args.encode_workers)
    encode = encode_info(report, args.encode_workers)
    print(f"  {report.seconds:.1f} s, {report.clips_per_s:.2f} clips/s")
    bench = LatentsBench(
        raw,
        latents,
        clip,
        args.batch,
        seed=args.seed,
        epochs=args.epochs,
        latent_epochs=args.latent_epochs,
        start_method=args.start_method,
    )
    return time_latents(bench, args.repeats, worker_counts, encode)


def stream_clip(
    args: argparse.Namespace, size: tuple[int, int] | None, video: str, audio: str
) -> Clip:
    return Clip(
        fps=args.out_fps,
        size=size,
        clip_seconds=args.clip_seconds,
        sample_rate=args.sample_rate,
        channels=args.channels,
        video_field=video,
        audio_field=audio,
        resize="crop",
    )


def time_stream(
    bench: StreamBench, args: argparse.Namespace, worker_counts: list[int]
) -> dict[str, Any]:
    """Runs of the stream's loader and its baseline, alternating; then its decode."""
    described = bench.describe()
    print(
        f"\n== {bench.name} stream: {bench.max_batches} batches a run\n"
        f"   baseline: {described['baseline']}"
    )
    runs: list[Run] = []
    for repeat in range(args.repeats):
        for workers in worker_counts:
            for pipeline in (bench.run_ours, bench.run_theirs):  # ours first: it fixes the starts
                run = pipeline(workers, repeat)
                runs.append(run)
                print(
                    f"  {run.pipeline:<10} workers={workers} repeat={repeat}: "
                    f"{run.samples_per_s:6.1f} samples/s, "
                    f"{run.samples_per_cpu_s:6.1f} samples/CPU-s, "
                    f"start-up {run.startup_s:.2f} s"
                )
    spans = bench.spans(args.decode_clips)
    print(f"  video decode: {len(spans)} spans, {args.decode_repeats} repeats")
    decode = measure_decode(spans, args.decode_repeats)
    throughput = summarize(runs, worker_counts)
    same = bench.same_output()
    print_throughput(throughput, args.repeats, f"{bench.name}, {clip_text(described['loader'])}")
    print_decode(decode)
    print(
        f"clips compared between the pipelines: {same['compared']}, differing: "
        f"{same['mismatched']}; samples in another bucket: {same['bucket_mismatched']}"
    )
    return {
        **described,
        "same_output": same,
        "throughput": throughput,
        "decode": decode,
        "meets_targets": {
            "samples_per_s_ratio": all(row["ratio"] >= RATIO_TARGET for row in throughput),
            "decode_efficiency": decode["efficiency"] >= DECODE_TARGET,
        },
        "runs": [asdict(r) for r in runs],
    }


def clip_text(loader: dict[str, Any]) -> str:
    """What a stream's batches hold, in a line."""
    audio = f"{loader['sample_rate']} Hz x{loader['channels']}"
    if "buckets" in loader:
        buckets = ", ".join(f"{b['name']} x{b['batch_size']}" for b in loader["buckets"])
        return f"buckets {buckets} at {loader['fps']:g} fps ({loader['resize']}) + {audio}"
    size = "x".join(map(str, loader["size"])) if loader["size"] else "source size"
    mix = ""
    if "weights" in loader:
        mix = " of " + ", ".join(f"{n} x{w:g}" for n, w in loader["weights"].items())
    return (
        f"batch {loader['batch_size']}{mix}, {loader['clip_seconds']:g} s clips at "
        f"{loader['fps']:g} fps {size} ({loader['resize']}) + {audio}"
    )


def print_summary(summary: dict[str, dict[str, Any]]) -> None:
    print(
        f"\n{'stream':<9} | {'ratio by workers':<24} | {'decode eff.':>11} | "
        f"{'(HWC PyAV)':>10} | verdict"
    )
    for name, row in summary.items():
        ratios = ", ".join(f"{w}: {r:.2f}" for w, r in row["ratio"].items())
        verdict = "meets targets" if row["meets_targets"] else "MISSES a target"
        if not row["same_output"]:
            verdict += "; outputs DIFFER (void)"
        efficiency = row.get("decode_efficiency")
        decode = "-" if efficiency is None else f"{efficiency:.3f}"
        hwc = row.get("decode_efficiency_pyav_layout")
        layout = "-" if hwc is None else f"{hwc:.3f}"
        print(f"{name:<9} | {ratios:<24} | {decode:>11} | {layout:>10} | {verdict}")
        if "latents_over_raw" in row:
            over = ", ".join(f"{w}: {r:.1f}" for w, r in row["latents_over_raw"].items())
            cpu = ", ".join(f"{w}: {r:.2f}" for w, r in row["cpu_ratio"].items())
            print(
                f"{'':<9} | latents / raw by workers: {over}; samples/CPU-s over webdataset: "
                f"{cpu}; encode {row['encode_clips_per_s']:.2f} clips/s"
            )
    print(
        f"(targets: ratio >= {RATIO_TARGET:g} at every worker count (latents: against "
        f"webdataset on the latent shards, in samples/s and samples/CPU-s), decode >= "
        f"{DECODE_TARGET} against PyAV giving the same (T, 3, H, W) uint8 output (HWC PyAV: "
        f"against PyAV in its own layout, no target); latents / raw >= {LATENTS_OVER_RAW_TARGET:g})"
    )


if __name__ == "__main__":
    sys.exit(main())
