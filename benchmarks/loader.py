"""How fast StreamingLoader delivers decoded clips, against webdataset on the same
shards with the same decode, and how close its video decoder comes to plain PyAV.

    python benchmarks/loader.py [--clips 256] [--seconds 4] [--size 128x128] [--fps 24]
        [--batch 16] [--clip-seconds 2] [--out-fps 8] [--out-size 128x128]
        [--workers 1,2] [--epochs 3] [--repeats 3] [--decode-clips 64]
        [--data DIR] [--out DIR]

Writes a synthetic data set (stoker.data.synth: H.264 with a keyframe a second, and
FLAC) into a temporary folder, or reads the packed data set at --data (a local
folder), and measures:

loader throughput: samples/s of StreamingLoader (random clip offsets, shuffled) and
    of a webdataset pipeline over the same tar files, WebDataset(shardshuffle)
    .shuffle(64) .map(decode) .batched(B) in a torch DataLoader with the same
    workers, start method and prefetch. Its map calls the same decode_video and
    decode_audio with the same parameters, at the clip start StreamingLoader used for
    that key in that epoch: both do the same decode work (checked: clips decoded by
    both must be equal). A run is --epochs epochs; the time to its first batch
    (worker start-up, first fetches) is reported apart, and the rate counts the
    samples after it. Runs alternate stoker / webdataset so that load from other
    processes hits both alike; the ratio is the median over repeats of stoker /
    webdataset in adjacent runs. Target: >= 1.0 at every worker count.

decode efficiency: in this process, on --decode-clips clip spans (starts on the
    source frame grid), source frames of the spans per CPU second (so per core) of
    decode_video asked for the same frames as plain PyAV gives (every source frame
    of the span, RGB at the source size; checked equal), against plain PyAV: av.open,
    seek to the keyframe before the span, decode at the source rate with one
    decoder thread, frame.to_ndarray(format="rgb24") for each frame of the span.
    Plain PyAV runs as written ("naive": swscale then starts a thread pool for every
    frame), with threads=1 for the conversion ("tuned"), and tuned plus a copy to
    decode_video's (T, 3, H, W) layout. Every decoder runs on a span before the
    next span. Efficiency is the median over spans and repeats of plain PyAV's CPU
    time on a span over decode_video's, against the faster of naive and tuned, both
    in PyAV's own (T, H, W, 3) layout. Target: >= 0.9. decode_video at the loader's
    parameters (--out-fps, --out-size) is timed on the same spans too.

Also reported: the loader's output frames/s per worker, the share of worker time
spent decoding (LoaderStats video_frames, decode_s) and bytes read per sample. Writes
the result to DIR/loader-<host>-<date>.json; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info

RATIO_TARGET = 1.0
DECODE_TARGET = 0.9
SHUFFLE_BUFFER = 64
COMPARED_SAMPLES = 16  # clips decoded by both pipelines and compared


@dataclass(frozen=True)
class Clip:
    """What a sample becomes, in both pipelines."""

    fps: float
    size: tuple[int, int] | None
    clip_seconds: float
    sample_rate: int
    channels: int
    video_field: str
    audio_field: str


class WebDatasetDecode:
    """The webdataset pipeline's map: the loader's decode of one sample, at the clip
    start the loader used for the same key in the same epoch. Module level: workers
    unpickle it. A worker sees a key once an epoch (its shards are fixed), so the
    times it has seen the key are the epoch."""

    def __init__(self, clip: Clip, starts: dict[str, list[float]]) -> None:
        self.clip = clip
        self.starts = starts
        self.seen: dict[str, int] = {}

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        import torch

        from stoker.data.decode import decode_audio, decode_video

        c = self.clip
        key = sample["__key__"]
        epoch = self.seen.get(key, 0)
        self.seen[key] = epoch + 1
        start = self.starts[key][epoch]
        video = decode_video(
            sample[c.video_field],
            fps=c.fps,
            size=c.size,
            start_s=start,
            clip_seconds=c.clip_seconds,
        )
        audio = decode_audio(
            sample[c.audio_field],
            field=c.audio_field,
            sample_rate=c.sample_rate,
            channels=c.channels,
            start_s=start,
            clip_seconds=c.clip_seconds,
        )
        return {
            "key": sample["__key__"],
            "video": torch.from_numpy(video),
            "audio": torch.from_numpy(audio),
        }


@dataclass
class Run:
    pipeline: str
    workers: int
    repeat: int
    startup_s: float
    """Until the first batch: worker start-up and the first batch's work."""
    samples_timed: int
    """Samples after the first batch: what the rate counts."""
    samples: int
    elapsed_s: float
    samples_per_s: float
    cpu_s: float
    """CPU time of the main process and the workers while the rate was counted."""
    samples_per_cpu_s: float
    video_frames: int = 0
    decode_s: float = 0.0
    bytes_read: int = 0


class TreeCpu:
    """CPU seconds (user + system) of this process and the processes under it: the
    DataLoader workers, which forkserver starts as its children (Linux /proc)."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.last: dict[int, float] = {}  # pid -> CPU seconds when last read

    def discover(self) -> None:
        """Find the processes under this one (call once the workers run)."""
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = self._stat(int(entry))
                if fields:
                    parents[int(entry)] = int(fields[1])
        found: set[int] = set()
        frontier = {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
            found |= frontier
        self.last = {pid: self.last.get(pid, 0.0) for pid in found}

    def read(self) -> float:
        """Total CPU seconds so far; a process that ended counts with its last reading."""
        for pid in self.last:
            fields = self._stat(pid)
            if fields:
                self.last[pid] = (int(fields[11]) + int(fields[12])) / self.tick
        return time.process_time() + sum(self.last.values())

    @staticmethod
    def _stat(pid: int) -> list[str] | None:
        """Fields of /proc/PID/stat after the command name: state, ppid, ..."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None


def drive(
    name: str,
    workers: int,
    repeat: int,
    batches: Iterator[dict[str, Any]],
    on_batch: Callable[[int, dict[str, Any]], None],
) -> Run:
    """Consume `batches`; time the samples after the first batch, in wall time and in
    CPU time of all processes (so a rate that load from elsewhere does not move)."""
    began = time.perf_counter()
    first_at = 0.0
    cpu = TreeCpu()
    cpu_at_first = 0.0
    timed = 0
    total = 0
    n = 0
    for n, batch in enumerate(batches):
        if n == 0:
            first_at = time.perf_counter()
            cpu.discover()
            cpu_at_first = cpu.read()
        else:
            timed += len(batch["key"])
            cpu.read()  # workers exit after the last batch: read them while they run
        total += len(batch["key"])
        on_batch(n, batch)
    elapsed = time.perf_counter() - first_at
    cpu_s = cpu.read() - cpu_at_first
    if n == 0:
        raise SystemExit(f"{name}: fewer than two batches; use more --clips or a smaller --batch")
    return Run(
        name,
        workers,
        repeat,
        startup_s=round(first_at - began, 3),
        samples_timed=timed,
        samples=total,
        elapsed_s=round(elapsed, 3),
        samples_per_s=round(timed / elapsed, 2),
        cpu_s=round(cpu_s, 3),
        samples_per_cpu_s=round(timed / cpu_s, 2),
    )


def clip_start_of(seed: int, position: int, duration_s: float, clip_seconds: float) -> float:
    """The start StreamingLoader draws for stream position `position` (stream.py)."""
    from stoker.data.decode import clip_start

    u = float(np.random.default_rng([seed % 2**64, position, 1]).random())
    return clip_start(duration_s, clip_seconds, u)


def webdataset_batches(
    urls: list[str],
    decode: WebDatasetDecode,
    batch: int,
    workers: int,
    context: Any,
    seed: int,
    epochs: int,
) -> Iterator[dict[str, Any]]:
    import webdataset as wds
    from torch.utils.data import DataLoader

    dataset = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            nodesplitter=wds.single_node_only,
            workersplitter=wds.split_by_worker,
            seed=seed,
            empty_check=False,
        )
        .shuffle(SHUFFLE_BUFFER)  # raw bytes: decode after shuffling, as is usual
        .map(decode)
        .batched(batch, partial=True)
        .repeat(epochs)
    )
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
        prefetch_factor=2 if workers else None,
    )
    yield from loader


def raw_pyav(data: bytes, start_s: float, clip_seconds: float, threads: int | None) -> Any:
    """Plain PyAV: every source frame shown in [start_s, start_s + clip_seconds), as
    RGB (T, H, W, 3). `threads`: swscale's; None leaves PyAV's default, which starts a
    thread pool for every frame's conversion (3.1k against 13.7k frames per CPU-second
    with threads=1, 128x128 H.264 on this 2-core VM)."""
    import av

    kwargs = {} if threads is None else {"threads": threads}
    frames = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1  # one core, as one loader worker has
        tb = stream.time_base
        origin = stream.start_time or 0
        container.seek(origin + int(start_s / tb), stream=stream)  # keyframe at or before
        for frame in container.decode(stream):
            t = float((frame.pts - origin) * tb)
            if t < start_s - 1e-3:
                continue
            if t >= start_s + clip_seconds - 1e-3:
                break
            frames.append(frame.to_ndarray(format="rgb24", **kwargs))
    return np.stack(frames)


def measure_decode(
    spans: list[tuple[bytes, float]],
    source_fps: float,
    clip: Clip,
    repeats: int,
) -> dict[str, Any]:
    from stoker.data.decode import decode_video

    seconds = clip.clip_seconds
    decoders: dict[str, Callable[[bytes, float], Any]] = {
        "plain PyAV, naive": lambda d, s: raw_pyav(d, s, seconds, None),
        "plain PyAV, tuned": lambda d, s: raw_pyav(d, s, seconds, 1),
        # The loader's layout, (T, 3, H, W): what a training step takes.
        "plain PyAV, tuned, to CHW": lambda d, s: np.ascontiguousarray(
            raw_pyav(d, s, seconds, 1).transpose(0, 3, 1, 2)
        ),
        "decode_video, same output": lambda d, s: decode_video(
            d, fps=source_fps, size=None, start_s=s, clip_seconds=seconds
        ),
        "decode_video, loader params": lambda d, s: decode_video(
            d, fps=clip.fps, size=clip.size, start_s=s, clip_seconds=seconds
        ),
    }
    # Untimed pass: warms caches and checks that the compared decoders agree.
    same = True
    for data, start in spans:
        ours = decoders["decode_video, same output"](data, start)
        plain = decoders["plain PyAV, naive"](data, start).transpose(0, 3, 1, 2)
        same = same and ours.shape == plain.shape and bool(np.array_equal(ours, plain))
    frames = len(spans) * round(seconds * source_fps)
    names = list(decoders)
    # CPU and wall seconds of each decoder on each (repeat, span).
    cpu = {name: np.zeros((repeats, len(spans))) for name in names}
    wall = {name: np.zeros((repeats, len(spans))) for name in names}
    for r in range(repeats):
        for i, (data, start) in enumerate(spans):
            # Every decoder on each span in turn, in a rotating order: load from other
            # processes and cache state hit all of them alike.
            for name in names[i % len(names) :] + names[: i % len(names)]:
                c0, w0 = time.process_time(), time.perf_counter()
                decoders[name](data, start)
                cpu[name][r, i] = time.process_time() - c0
                wall[name][r, i] = time.perf_counter() - w0
    rows = {
        name: {
            "cpu_s": round(float(np.median(cpu[name].sum(axis=1))), 4),
            "wall_s": round(float(np.median(wall[name].sum(axis=1))), 4),
            "frames_per_cpu_s": round(frames / float(np.median(cpu[name].sum(axis=1))), 1),
            "frames_per_wall_s": round(frames / float(np.median(wall[name].sum(axis=1))), 1),
        }
        for name in names
    }
    # Efficiency: plain PyAV's CPU time over decode_video's on the same span, just
    # decoded one after the other, against the faster plain PyAV on that span; the
    # median over spans and repeats, which a burst of load elsewhere barely moves.
    ours = cpu["decode_video, same output"]
    naive = cpu["plain PyAV, naive"]
    plain = np.minimum(naive, cpu["plain PyAV, tuned"])
    by_repeat = plain.sum(axis=1) / ours.sum(axis=1)
    return {
        "spans": len(spans),
        "clip_seconds": seconds,
        "source_frames": frames,
        "repeats": repeats,
        "same_frames_as_plain_pyav": same,
        "rows": rows,
        "efficiency": round(float(np.median(plain / ours)), 3),
        "efficiency_by_repeat": [round(float(e), 3) for e in by_repeat],
        "efficiency_vs_naive": round(float(np.median(naive / ours)), 3),
    }


def _rate(row: dict[str, float]) -> float:
    return row["frames_per_cpu_s"]


def parse_size(text: str) -> tuple[int, int] | None:
    if text.lower() == "none":
        return None
    height, _, width = text.lower().partition("x")
    return int(height), int(width)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a packed data set (local folder); default: synthesize")
    parser.add_argument("--clips", type=int, default=256)
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
    parser.add_argument("--decode-clips", type=int, default=64)
    parser.add_argument("--decode-repeats", type=int, default=5)
    parser.add_argument("--start-method", default="forkserver", choices=("forkserver", "spawn"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    worker_counts = [int(w) for w in args.workers.split(",")]

    import multiprocessing

    from stoker.data.dataset import open_dataset
    from stoker.data.loader import StreamingLoader
    from stoker.data.synth import synth_dataset

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="stoker-bench-loader-"))
    try:
        if args.data:
            url = args.data
        else:
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
                workers=os.cpu_count() or 1,
            )
            print(f"  {time.perf_counter() - began:.1f} s")
        source = open_dataset(url)
        if "file" not in source.fs.protocol:
            raise SystemExit(f"--data {url}: webdataset reads local shards here; copy it locally")
        manifest = source.manifest
        shard_paths = [source.shard_path(i) for i in range(len(manifest.shards))]
        catalog = {
            e.key: (shard, e)
            for shard in range(len(shard_paths))
            for e in source.read_index(shard).samples
        }
        first = next(iter(catalog.values()))[1]
        if first.video is None or first.audio is None:
            raise SystemExit(f"{url}: the benchmark needs samples with video and audio")
        clip = Clip(
            fps=args.out_fps,
            size=args.out_size,
            clip_seconds=args.clip_seconds,
            sample_rate=args.sample_rate,
            channels=args.channels,
            video_field=first.video.field,
            audio_field=first.audio.field,
        )
        context = multiprocessing.get_context(args.start_method)
        starts: dict[str, list[float]] = {}  # key -> clip start StreamingLoader used, by epoch
        reference: dict[str, tuple[Any, Any]] = {}  # key -> (video, audio) from stoker
        check = {"compared": 0, "mismatched": 0}

        def ours(workers: int, repeat: int) -> Run:
            loader = StreamingLoader(
                source,
                batch_size=args.batch,
                num_workers=workers,
                seed=args.seed,
                modalities=("video", "audio"),
                fps=clip.fps,
                size=clip.size,
                clip_seconds=clip.clip_seconds,
                sample_rate=clip.sample_rate,
                channels=clip.channels,
                clip_offset="random",
                shuffle=True,
                start_method=args.start_method,
            )
            at_first: dict[str, float] = {}
            first_run = not starts  # every run streams the same clips: record them once

            def on_batch(n: int, batch: dict[str, Any]) -> None:
                if n == 0:
                    at_first.update(loader.stats().as_dict())
                if not first_run:
                    return
                positions = batch["position"].tolist()
                for row, (key, position) in enumerate(zip(batch["key"], positions, strict=True)):
                    duration = catalog[key][1].duration_s
                    epoch = position // manifest.samples
                    starts.setdefault(key, [0.0] * args.epochs)[epoch] = clip_start_of(
                        args.seed, position, duration, clip.clip_seconds
                    )
                    if n == 1 and len(reference) < COMPARED_SAMPLES:
                        reference[key] = (batch["video"][row], batch["audio"][row])

            batches = loader.batches(max_batches=args.epochs * manifest.samples // args.batch)
            run = drive("stoker", workers, repeat, batches, on_batch)
            stats = loader.stats().as_dict()
            run.video_frames = int(stats["video_frames"] - at_first["video_frames"])
            run.decode_s = round(stats["decode_s"] - at_first["decode_s"], 3)
            run.bytes_read = int(stats["bytes_read"])
            return run

        def theirs(workers: int, repeat: int) -> Run:
            import torch

            frames = 0
            compared: set[str] = set()

            def on_batch(n: int, batch: dict[str, Any]) -> None:
                nonlocal frames
                if n > 0:
                    frames += int(batch["video"].shape[0] * batch["video"].shape[1])
                for row, key in enumerate(batch["key"]):
                    if key in reference and key not in compared:  # its first epoch
                        compared.add(key)
                        video, audio = reference[key]
                        check["compared"] += 1
                        equal = torch.equal(video, batch["video"][row]) and torch.equal(
                            audio, batch["audio"][row]
                        )
                        check["mismatched"] += not equal

            decode = WebDatasetDecode(clip, starts)
            batches = webdataset_batches(
                shard_paths, decode, args.batch, workers, context, args.seed + repeat, args.epochs
            )
            run = drive("webdataset", workers, repeat, batches, on_batch)
            run.video_frames = frames
            run.bytes_read = args.epochs * manifest.totals.bytes  # every shard, start to end
            return run

        print(f"loader runs: {manifest.samples} samples an epoch, {args.epochs} epochs a run")
        runs: list[Run] = []
        for repeat in range(args.repeats):
            for workers in worker_counts:
                for pipeline in (ours, theirs):  # stoker first: it fixes the clip starts
                    run = pipeline(workers, repeat)
                    runs.append(run)
                    print(
                        f"  {run.pipeline:<10} workers={workers} repeat={repeat}: "
                        f"{run.samples_per_s:6.1f} samples/s, "
                        f"{run.samples_per_cpu_s:6.1f} samples/CPU-s, "
                        f"start-up {run.startup_s:.2f} s"
                    )

        spans = []
        for key in sorted(starts)[: args.decode_clips]:
            shard, entry = catalog[key]
            assert entry.video is not None
            member = entry.members[entry.video.field]
            data = source.fs.cat_file(
                shard_paths[shard], start=member.offset, end=member.offset + member.size
            )
            grid = entry.video.fps  # starts on the source frame grid: both decoders agree
            spans.append((data, round(starts[key][0] * grid) / grid))
        print(f"video decode: {len(spans)} spans, {args.decode_repeats} repeats")
        decode = measure_decode(spans, first.video.fps, clip, args.decode_repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    throughput = summarize(runs, worker_counts)
    same_output = {**check, "ok": check["compared"] > 0 and check["mismatched"] == 0}
    meets = {
        "samples_per_s_ratio": all(row["ratio"] >= RATIO_TARGET for row in throughput),
        "decode_efficiency": decode["efficiency"] >= DECODE_TARGET,
    }
    machine = machine_info()
    result: dict[str, Any] = {
        "benchmark": "loader",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "data": {
            "url": args.data or "synthetic (stoker.data.synth)",
            "samples": manifest.samples,
            "shards": len(manifest.shards),
            "bytes": manifest.totals.bytes,
            "source": {
                "codec": first.video.codec,
                "size": [first.video.height, first.video.width],
                "fps": first.video.fps,
                "keyframe_interval": first.video.keyframe_interval,
                "seconds": first.duration_s,
                "audio": f"{first.audio.codec} {first.audio.sample_rate} Hz "
                f"x{first.audio.channels}",
            },
        },
        "loader": {
            **asdict(clip),
            "batch_size": args.batch,
            "epochs_per_run": args.epochs,
            "clip_offset": "random",
            "shuffle": True,
            "start_method": args.start_method,
            "repeats": args.repeats,
        },
        "baseline": (
            f"webdataset {_version('webdataset')}: WebDataset(shardshuffle={len(manifest.shards)})"
            f".shuffle({SHUFFLE_BUFFER}).map(same decode).batched({args.batch}) in a torch "
            "DataLoader with the same workers and start method"
        ),
        "same_output": same_output,
        "throughput": throughput,
        "decode": decode,
        "targets": {"samples_per_s_ratio": RATIO_TARGET, "decode_efficiency": DECODE_TARGET},
        "meets_targets": meets,
        "runs": [asdict(r) for r in runs],
    }
    print_tables(result)
    args.out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    path = args.out / f"loader-{machine['host']}-{now:%Y-%m-%d}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    if not same_output["ok"]:
        print("the two pipelines decoded different clips: the comparison is void")
        return 1
    return 0 if all(meets.values()) else 1


def summarize(runs: list[Run], worker_counts: list[int]) -> list[dict[str, Any]]:
    """Per worker count: medians over repeats; ratio from adjacent stoker/webdataset runs."""
    rows = []
    for workers in worker_counts:
        ours = [r for r in runs if r.workers == workers and r.pipeline == "stoker"]
        theirs = [r for r in runs if r.workers == workers and r.pipeline == "webdataset"]
        ratios = [a.samples_per_s / b.samples_per_s for a, b in zip(ours, theirs, strict=True)]
        cpu_ratios = [
            a.samples_per_cpu_s / b.samples_per_cpu_s for a, b in zip(ours, theirs, strict=True)
        ]
        w = max(1, workers)
        rows.append(
            {
                "workers": workers,
                "stoker_samples_per_s": round(statistics.median(r.samples_per_s for r in ours), 2),
                "webdataset_samples_per_s": round(
                    statistics.median(r.samples_per_s for r in theirs), 2
                ),
                "ratio": round(statistics.median(ratios), 3),
                "ratios": [round(x, 3) for x in ratios],
                "stoker_samples_per_cpu_s": round(
                    statistics.median(r.samples_per_cpu_s for r in ours), 2
                ),
                "webdataset_samples_per_cpu_s": round(
                    statistics.median(r.samples_per_cpu_s for r in theirs), 2
                ),
                "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                "stoker_startup_s": round(statistics.median(r.startup_s for r in ours), 2),
                "webdataset_startup_s": round(statistics.median(r.startup_s for r in theirs), 2),
                "stoker_frames_per_s_per_worker": round(
                    statistics.median(r.video_frames / r.elapsed_s / w for r in ours), 1
                ),
                "stoker_decode_share": round(
                    statistics.median(r.decode_s / (r.elapsed_s * w) for r in ours), 3
                ),
                "stoker_bytes_read_per_sample": round(
                    statistics.median(r.bytes_read / r.samples for r in ours)
                ),
                "webdataset_bytes_read_per_sample": round(
                    statistics.median(r.bytes_read / r.samples for r in theirs)
                ),
            }
        )
    return rows


def print_tables(result: dict[str, Any]) -> None:
    loader = result["loader"]
    size = "x".join(map(str, loader["size"])) if loader["size"] else "source size"
    print(
        f"\nloader throughput, samples/s (median of {loader['repeats']}; start-up excluded): "
        f"batch {loader['batch_size']}, {loader['clip_seconds']:g} s clips at "
        f"{loader['fps']:g} fps {size} + {loader['sample_rate']} Hz x{loader['channels']}"
    )
    print(
        f"{'workers':>7} | {'stoker':>7} {'wds':>7} {'ratio':>6} {'target':>9} | "
        f"{'per CPU-s: stoker':>17} {'wds':>6} {'ratio':>6} | {'start-up s':>11} | "
        f"{'frames/s/worker':>15} {'decode share':>12}"
    )
    for row in result["throughput"]:
        mark = "ok" if row["ratio"] >= RATIO_TARGET else "MISS"
        startup = f"{row['stoker_startup_s']:.2f}/{row['webdataset_startup_s']:.2f}"
        print(
            f"{row['workers']:>7} | {row['stoker_samples_per_s']:>7.1f} "
            f"{row['webdataset_samples_per_s']:>7.1f} {row['ratio']:>6.2f} "
            f"{'>=' + format(RATIO_TARGET, 'g'):>4} {mark:<4} | "
            f"{row['stoker_samples_per_cpu_s']:>17.1f} {row['webdataset_samples_per_cpu_s']:>6.1f} "
            f"{row['cpu_ratio']:>6.2f} | {startup:>11} | "
            f"{row['stoker_frames_per_s_per_worker']:>15.1f} {row['stoker_decode_share']:>12.2f}"
        )
    print("(start-up: stoker/webdataset, until the first batch; ratio: median of adjacent runs)")
    decode = result["decode"]
    best = max(decode["rows"]["plain PyAV, naive"], decode["rows"]["plain PyAV, tuned"], key=_rate)
    print(
        f"\nvideo decode, one process: {decode['spans']} spans of {decode['clip_seconds']:g} s "
        f"= {decode['source_frames']} source frames, medians of {decode['repeats']} repeats; "
        f"same frames as plain PyAV: {decode['same_frames_as_plain_pyav']}"
    )
    print(f"{'decoder':<30} {'frames/CPU-s':>13} {'frames/wall-s':>14} {'x best plain':>13}")
    for name, row in decode["rows"].items():
        print(
            f"{name:<30} {row['frames_per_cpu_s']:>13.0f} {row['frames_per_wall_s']:>14.0f} "
            f"{_rate(row) / _rate(best):>13.2f}"
        )
    verdict = "meets" if decode["efficiency"] >= DECODE_TARGET else "MISSES"
    print(
        f"decode efficiency {decode['efficiency']:.3f} ({verdict} the {DECODE_TARGET} target; "
        f"median over spans; of totals by repeat {decode['efficiency_by_repeat']}; "
        f"{decode['efficiency_vs_naive']:.2f} against naive PyAV)"
    )
    same = result["same_output"]
    print(
        f"clips compared between the pipelines: {same['compared']}, differing: {same['mismatched']}"
    )


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    sys.exit(main())
