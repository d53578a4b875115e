"""The latents stream of benchmarks/loader.py: what encoding a data set once buys the
loader. On the same clips, three pipelines:

raw: StreamingLoader decoding the media data set (video + audio at the loader's out
    size, fps and clip length), clip_offset "start".
latents: StreamingLoader on the latent data set `run_encode` made from it with the
    tiny encoder (stoker.data.tiny_encoder:build), decoded at the same out size, fps
    and clip length, modalities ("latent",): a safetensors load a sample, no media.
webdataset: the pipeline a user would write for the latent shards, WebDataset
    (shardshuffle) .shuffle(64) .map(key + safetensors.torch.load of the
    `latent.safetensors` member) .batched(B), in a torch DataLoader with the same
    workers, start method and prefetch.

An encode decodes each clip from its start (encode_shard), so the raw stream takes
clip_offset "start" too: the latents are the tiny encoder's output on exactly the clips
the raw stream decodes (checked: the encoder run here on raw clips gives the latent
loader's tensors for the same keys, bit for bit). With clip_offset "random" the raw
stream would decode another clip of each sample every epoch; a latent sample is
always its one encoded clip, whatever the offset setting. The webdataset pipeline's
tensors are checked equal to the latent loader's for the same keys.

Latent runs are --latent-epochs epochs long (raw runs --epochs): a latent sample costs
so little that a run of a few epochs would be mostly start-up. Runs alternate raw /
latents / webdataset at each worker count, every repeat; the ratios are medians over
repeats of the ratio of adjacent runs.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.loader_runs import RATIO_TARGET, Run, drive
from benchmarks.loader_stream_bench import SHUFFLE_BUFFER, Clip, shard_urls, wds_version

if TYPE_CHECKING:
    from stoker.data.encode.pipeline import EncodeReport
    from stoker.data.sets.source import DataSource
    from stoker.data.stream.loader import StreamingLoader

LATENTS = "latents"
ENCODER = "stoker.data.tiny_encoder:build"
# What encoding once must buy: latent samples/s over raw decode's, every worker count.
LATENTS_OVER_RAW_TARGET = 10.0
COMPARED_SAMPLES = 16  # keys checked raw -> encoder -> latents, and latents -> webdataset


def encode_latents(
    raw: DataSource, dst: Path, clip: Clip, batch: int, workers: int
) -> tuple[DataSource, EncodeReport]:
    """The latent data set of `raw` at `dst`: `run_encode` with the tiny encoder, each
    clip decoded as the raw stream decodes it."""
    from stoker.data.encode.pipeline import EncodeRequest, run_encode
    from stoker.data.encode.shard import DecodeSpec
    from stoker.data.sets.dataset import open_dataset

    # Imported before the encode's clock starts, which would count them otherwise: 32
    # clips at 64x64 encoded at 11 clips/s in a fresh process, 57 after the plain stream.
    for module in (
        "stoker.data.media.decode",
        "stoker.data.encode.tiny_encoder",
        "safetensors.torch",
    ):
        importlib.import_module(module)

    if clip.size is None:
        raise SystemExit("--out-size none: the latents stream encodes clips of one size")
    spec = DecodeSpec(
        ("video", "audio"),
        clip.fps,
        clip.size,
        clip.clip_seconds,
        clip.sample_rate,
        clip.channels,
        clip.resize,
    )
    request = EncodeRequest(
        raw.url, str(dst), ENCODER, decode=spec, batch_size=batch, workers=workers
    )
    report = run_encode(request)
    if report.skipped:
        raise SystemExit(f"the encode left out samples: {report.skipped[:3]}")
    return open_dataset(str(dst)), report


def encode_info(report: EncodeReport, workers: int) -> dict[str, Any]:
    """The encode's own throughput, for the result file."""
    return {
        "encoder": ENCODER,
        "processes": workers,
        "clips": report.encoded_samples,
        "shards": report.written,
        "seconds": round(report.seconds, 2),
        "encode_seconds": round(report.encode_seconds, 2),
        "clips_per_s": round(report.clips_per_s, 2),
        "encoder_busy": round(report.encode_seconds / report.seconds, 3) if report.seconds else 0,
    }


class LoadLatents:
    """The webdataset pipeline's map: the sample's key and its tensors by name.
    Module level: workers unpickle it."""

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import load

        return {"key": sample["__key__"], **load(sample["latent.safetensors"])}


class LatentsBench:
    """Raw, latents and webdataset runs on the same clips, and the checks that they are."""

    name = LATENTS

    def __init__(
        self,
        raw: DataSource,
        latents: DataSource,
        clip: Clip,
        batch: int,
        *,
        seed: int,
        epochs: int,
        latent_epochs: int,
        start_method: str,
    ) -> None:
        self.raw = raw
        self.latents = latents
        self.clip = clip
        self.batch = batch
        self.seed = seed
        self.epochs = epochs
        self.latent_epochs = latent_epochs
        self.start_method = start_method
        self.raw_batches = epochs * raw.manifest.samples // batch
        self.latent_batches = latent_epochs * latents.manifest.samples // batch
        self.raw_clips: dict[str, tuple[Any, Any]] = {}  # key -> (video, audio), raw loader
        self.reference: dict[str, dict[str, Any]] = {}  # key -> tensors, latent loader
        self.check = {"encoded_compared": 0, "encoded_mismatched": 0}
        self.check |= {"compared": 0, "mismatched": 0}

    def loader(
        self, source: DataSource, workers: int, modalities: tuple[str, ...]
    ) -> StreamingLoader:
        from stoker.data.stream.loader import StreamingLoader

        c = self.clip
        return StreamingLoader(
            source,
            batch_size=self.batch,
            num_workers=workers,
            seed=self.seed,
            modalities=modalities,
            fps=c.fps,
            size=c.size,
            clip_seconds=c.clip_seconds,
            sample_rate=c.sample_rate,
            channels=c.channels,
            clip_offset="start",
            resize=c.resize,
            shuffle=True,
            start_method=self.start_method,
        )

    def run_raw(self, workers: int, repeat: int) -> Run:
        loader = self.loader(self.raw, workers, ("video", "audio"))
        at_first: dict[str, float] = {}
        record = not self.raw_clips

        def on_batch(n: int, batch: dict[str, Any]) -> None:
            if n == 0:
                at_first.update(loader.stats().as_dict())
            for row, key in enumerate(batch["key"]):
                if record and len(self.raw_clips) < COMPARED_SAMPLES:
                    video, audio = batch["video"][row], batch["audio"][row]
                    self.raw_clips.setdefault(key, (video.clone(), audio.clone()))

        run = drive("raw", workers, repeat, loader.batches(self.raw_batches), on_batch)
        stats = loader.stats().as_dict()
        run.video_frames = int(stats["video_frames"] - at_first["video_frames"])
        run.decode_s = round(stats["decode_s"] - at_first["decode_s"], 3)
        run.bytes_read = int(stats["bytes_read"])
        return run

    def run_latents(self, workers: int, repeat: int) -> Run:
        loader = self.loader(self.latents, workers, ("latent",))
        at_first: dict[str, float] = {}

        def on_batch(n: int, batch: dict[str, Any]) -> None:
            if n == 0:
                at_first.update(loader.stats().as_dict())
            for row, key in enumerate(batch["key"]):
                if key in self.raw_clips and key not in self.reference:
                    self.reference[key] = {
                        name: t[row].clone() for name, t in batch["latent"].items()
                    }

        run = drive("stoker", workers, repeat, loader.batches(self.latent_batches), on_batch)
        stats = loader.stats().as_dict()
        run.decode_s = round(stats["decode_s"] - at_first["decode_s"], 3)
        run.bytes_read = int(stats["bytes_read"])
        return run

    def webdataset(self, workers: int, repeat: int) -> Iterator[dict[str, Any]]:
        import multiprocessing

        import webdataset as wds
        from torch.utils.data import DataLoader

        urls = shard_urls(self.latents)
        dataset = (
            wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                nodesplitter=wds.single_node_only,
                workersplitter=wds.split_by_worker,
                seed=self.seed + repeat,
                empty_check=False,
            )
            .shuffle(SHUFFLE_BUFFER)
            .map(LoadLatents())
            .batched(self.batch, partial=True)
            .repeat(self.latent_epochs)
        )
        context = multiprocessing.get_context(self.start_method) if workers else None
        yield from DataLoader(
            dataset,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=context,
            prefetch_factor=2 if workers else None,
        )

    def run_webdataset(self, workers: int, repeat: int) -> Run:
        import torch

        compared: set[str] = set()
        per_sample = self.latents.manifest.totals.bytes / self.latents.manifest.samples
        read = 0.0

        def on_batch(n: int, batch: dict[str, Any]) -> None:
            nonlocal read
            read += per_sample * len(batch["key"])
            for row, key in enumerate(batch["key"]):
                if key in self.reference and key not in compared:  # its first epoch
                    compared.add(key)
                    self.check["compared"] += 1
                    equal = all(
                        torch.equal(t, batch[name][row]) for name, t in self.reference[key].items()
                    )
                    self.check["mismatched"] += not equal

        run = drive("webdataset", workers, repeat, self.webdataset(workers, repeat), on_batch)
        run.bytes_read = round(read)  # every shard, start to end
        return run

    def check_encoded(self) -> None:
        """The tiny encoder on the raw loader's clips gives the latent loader's tensors:
        the two streams hold the same clips (the encoder is batch-independent and
        deterministic, so bit-equal is the right test)."""
        import torch

        from stoker.data.encode.tiny_encoder import build

        encoder = build()
        for key, (video, audio) in self.raw_clips.items():
            if key not in self.reference:
                continue
            out = encoder({"video": video[None], "audio": audio[None]})
            self.check["encoded_compared"] += 1
            equal = all(torch.equal(out[n][0], t) for n, t in self.reference[key].items())
            self.check["encoded_mismatched"] += not equal

    def same_output(self) -> dict[str, Any]:
        c = self.check
        ok = c["compared"] > 0 and c["encoded_compared"] > 0
        return {**c, "ok": ok and not c["mismatched"] and not c["encoded_mismatched"]}

    def describe(self) -> dict[str, Any]:
        from benchmarks.loader_stream_bench import source_info

        manifest = self.latents.manifest
        assert manifest.encoding is not None
        shapes = {
            name: {"shape": list(t.shape), "dtype": t.dtype}
            for name, t in manifest.encoding.shapes[""].items()
        }
        shards = len(manifest.shards)
        return {
            "data": {
                "raw": source_info(self.raw),
                "latents": {
                    "samples": manifest.samples,
                    "shards": shards,
                    "bytes": manifest.totals.bytes,
                    "tensors": shapes,
                },
            },
            "loader": {
                **asdict(self.clip),
                "batch_size": self.batch,
                "clip_offset": "start",
                "shuffle": True,
                "start_method": self.start_method,
                "raw_epochs_per_run": self.epochs,
                "raw_batches_per_run": self.raw_batches,
                "latent_epochs_per_run": self.latent_epochs,
                "latent_batches_per_run": self.latent_batches,
            },
            "baseline": f"webdataset {wds_version()}: WebDataset(shardshuffle={shards})"
            f".shuffle({SHUFFLE_BUFFER}).map(key + safetensors.torch.load(latent.safetensors))"
            f".batched({self.batch}).repeat({self.latent_epochs}) in a torch DataLoader with "
            "the same workers and start method",
        }


def time_latents(
    bench: LatentsBench, repeats: int, worker_counts: list[int], encode: dict[str, Any]
) -> dict[str, Any]:
    """Runs raw / latents / webdataset, alternating; the checks; the summary."""
    print(
        f"\n== {bench.name} stream: {bench.raw_batches} raw, {bench.latent_batches} latent "
        f"batches a run\n   baseline: {bench.describe()['baseline']}"
    )
    runs: list[Run] = []
    for repeat in range(repeats):
        for workers in worker_counts:
            # raw first: it picks the clips that are checked
            for pipeline in (bench.run_raw, bench.run_latents, bench.run_webdataset):
                run = pipeline(workers, repeat)
                runs.append(run)
                print(
                    f"  {run.pipeline:<10} workers={workers} repeat={repeat}: "
                    f"{run.samples_per_s:7.1f} samples/s, "
                    f"{run.samples_per_cpu_s:7.1f} samples/CPU-s, "
                    f"start-up {run.startup_s:.2f} s"
                )
    bench.check_encoded()
    rows = summarize_latents(runs, worker_counts)
    same = bench.same_output()
    print_latents(rows, repeats, encode, bench.describe())
    print(
        f"clips checked raw -> tiny encoder -> latent loader: {same['encoded_compared']}, "
        f"differing: {same['encoded_mismatched']}; latent loader -> webdataset: "
        f"{same['compared']}, differing: {same['mismatched']}"
    )
    return {
        **bench.describe(),
        "encode": encode,
        "same_output": same,
        "throughput": rows,
        "meets_targets": {
            "latents_over_webdataset": all(r["ratio"] >= RATIO_TARGET for r in rows),
            "cpu_over_webdataset": all(r["cpu_ratio"] >= RATIO_TARGET for r in rows),
            "latents_over_raw": all(r["latents_over_raw"] >= LATENTS_OVER_RAW_TARGET for r in rows),
        },
        "runs": [asdict(r) for r in runs],
    }


def _median(values: Any) -> float:
    return float(statistics.median(values))


def summarize_latents(runs: list[Run], worker_counts: list[int]) -> list[dict[str, Any]]:
    """Per worker count: medians over repeats; ratios of the runs of one repeat."""
    rows = []
    pipelines = {"raw": "raw", "stoker": "latents", "webdataset": "webdataset"}
    for workers in worker_counts:
        by = {
            label: [r for r in runs if r.workers == workers and r.pipeline == pipeline]
            for pipeline, label in pipelines.items()
        }
        w = max(1, workers)
        row: dict[str, Any] = {"workers": workers}
        for label, rs in by.items():
            row[f"{label}_samples_per_s"] = round(_median(r.samples_per_s for r in rs), 2)
            row[f"{label}_samples_per_s_per_worker"] = round(row[f"{label}_samples_per_s"] / w, 2)
            row[f"{label}_samples_per_cpu_s"] = round(_median(r.samples_per_cpu_s for r in rs), 2)
            row[f"{label}_startup_s"] = round(_median(r.startup_s for r in rs), 2)
            row[f"{label}_bytes_read_per_sample"] = round(
                _median(r.bytes_read / r.samples for r in rs)
            )
        over_raw = [
            a.samples_per_s / b.samples_per_s for a, b in zip(by["latents"], by["raw"], strict=True)
        ]
        over_raw_cpu = [
            a.samples_per_cpu_s / b.samples_per_cpu_s
            for a, b in zip(by["latents"], by["raw"], strict=True)
        ]
        ratios = [
            a.samples_per_s / b.samples_per_s
            for a, b in zip(by["latents"], by["webdataset"], strict=True)
        ]
        cpu_ratios = [
            a.samples_per_cpu_s / b.samples_per_cpu_s
            for a, b in zip(by["latents"], by["webdataset"], strict=True)
        ]
        row |= {
            "latents_over_raw": round(_median(over_raw), 2),
            "latents_over_raw_all": [round(x, 2) for x in over_raw],
            "latents_over_raw_cpu": round(_median(over_raw_cpu), 2),
            "ratio": round(_median(ratios), 3),
            "ratios": [round(x, 3) for x in ratios],
            "cpu_ratio": round(_median(cpu_ratios), 3),
            "raw_decode_share": round(
                _median(r.decode_s / (r.elapsed_s * w) for r in by["raw"]), 3
            ),
        }
        rows.append(row)
    return rows


def print_latents(
    rows: list[dict[str, Any]], repeats: int, encode: dict[str, Any], described: dict[str, Any]
) -> None:
    loader = described["loader"]
    tensors = " + ".join(
        f"{name} {t['shape']} {t['dtype']}"
        for name, t in described["data"]["latents"]["tensors"].items()
    )
    size = "x".join(map(str, loader["size"]))
    print(
        f"\nencode ({encode['encoder']}, {encode['processes']} process): {encode['clips']} clips "
        f"in {encode['seconds']:.1f} s, {encode['clips_per_s']:.2f} clips/s, encoder busy "
        f"{encode['encoder_busy']:.0%}"
    )
    print(
        f"latents throughput, samples/s (median of {repeats}; start-up excluded): batch "
        f"{loader['batch_size']}, {loader['clip_seconds']:g} s clips at {loader['fps']:g} fps "
        f"{size} + {loader['sample_rate']} Hz x{loader['channels']} (raw) / {tensors} (latents)"
    )
    print(
        f"{'workers':>7} | {'raw':>6} {'latents':>8} {'wds':>8} | {'per worker: raw':>15} "
        f"{'latents':>8} {'wds':>8} | {'per CPU-s: raw':>14} {'latents':>8} {'wds':>8} | "
        f"{'lat/raw':>7} | {'lat/wds':>7} {'target':>9} | {'start-up s':>14}"
    )
    labels = ("raw", "latents", "webdataset")
    for r in rows:
        mark = "ok" if r["ratio"] >= RATIO_TARGET else "MISS"
        startup = "/".join(f"{r[f'{p}_startup_s']:.2f}" for p in labels)
        rates, per_worker, per_cpu = (
            [r[f"{p}_samples_per_{what}"] for p in labels]
            for what in ("s", "s_per_worker", "cpu_s")
        )
        print(
            f"{r['workers']:>7} | {rates[0]:>6.1f} {rates[1]:>8.1f} {rates[2]:>8.1f} | "
            f"{per_worker[0]:>15.1f} {per_worker[1]:>8.1f} {per_worker[2]:>8.1f} | "
            f"{per_cpu[0]:>14.1f} {per_cpu[1]:>8.1f} {per_cpu[2]:>8.1f} | "
            f"{r['latents_over_raw']:>7.1f} | "
            f"{r['ratio']:>7.2f} {'>=' + format(RATIO_TARGET, 'g'):>4} {mark:<4} | {startup:>14}"
        )
    print(
        f"(lat/raw: latent loader over raw loader, target >= {LATENTS_OVER_RAW_TARGET:g}; "
        "lat/wds: latent loader over "
        "webdataset on the latent shards; ratios: median of adjacent runs; start-up: "
        "raw/latents/webdataset, until the first batch)"
    )
