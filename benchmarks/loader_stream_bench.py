"""A stream timed against its webdataset baseline, for benchmarks/loader.py: what
both pipelines decode, and the bookkeeping that makes them decode the same clips.

Every decode is the loader's own (decode_video with the same size, resize and clip
length, decode_audio), at the clip start the loader drew for the same sample: the
n-th time a webdataset worker meets a sample it takes the start of the loader's n-th
delivery of it (a worker's shards are fixed, so its n-th meeting is the sample's n-th
epoch). Clips decoded by both pipelines are compared, and with buckets, each sample's
bucket in the loader's batches with assign_bucket on its index entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from benchmarks.loader_decode import Span
from benchmarks.loader_runs import Run, drive

if TYPE_CHECKING:
    from stoker.data.format.shard_format import SampleEntry
    from stoker.data.sets.source import DataSource
    from stoker.data.stream.loader import StreamingLoader

SHUFFLE_BUFFER = 64
COMPARED_SAMPLES = 16  # clips decoded by both pipelines and compared
COMPARED_PER_BATCH = 4  # from several batches: with buckets, several buckets


@dataclass(frozen=True)
class Clip:
    """What a sample becomes, in both pipelines (a bucket overrides size and length)."""

    fps: float
    size: tuple[int, int] | None
    clip_seconds: float
    sample_rate: int
    channels: int
    video_field: str
    audio_field: str
    resize: Literal["crop", "stretch"] = "crop"


@dataclass(frozen=True)
class Shape:
    """One sample's output: frame size and clip length (its bucket's, with buckets)."""

    size: tuple[int, int] | None
    clip_seconds: float
    bucket: int = 0


@dataclass(frozen=True)
class Item:
    """A sample of a stream: where it is and what it is decoded to."""

    source: DataSource
    shard: int
    entry: SampleEntry
    shape: Shape

    @property
    def bytes_per_sample(self) -> float:
        """What webdataset reads for it: its share of its data set's tar bytes."""
        manifest = self.source.manifest
        return manifest.totals.bytes / manifest.samples


class WebDatasetDecode:
    """The webdataset pipeline's map: the loader's decode of one sample at the loader's
    clip start. Module level: workers unpickle it. `prefix` makes the sample's name
    in the stream (`wide/` in a mixture)."""

    def __init__(
        self, clip: Clip, shapes: dict[str, Shape], starts: dict[str, list[float]], prefix: str
    ) -> None:
        self.clip = clip
        self.shapes = shapes
        self.starts = starts
        self.prefix = prefix
        self.seen: dict[str, int] = {}

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        import torch

        from stoker.data.media.decode import decode_audio, decode_video

        c = self.clip
        name = self.prefix + sample["__key__"]
        times = self.seen.get(name, 0)
        self.seen[name] = times + 1
        # A sample met more often than the loader delivered it (the runs end at about
        # the same count, not the same samples): one of the loader's starts again.
        starts = self.starts.get(name) or [0.0]
        start = starts[times % len(starts)]
        shape = self.shapes[name]
        video = decode_video(
            sample[c.video_field],
            fps=c.fps,
            size=shape.size,
            resize=c.resize,
            start_s=start,
            clip_seconds=shape.clip_seconds,
        )
        audio = decode_audio(
            sample[c.audio_field],
            field=c.audio_field,
            sample_rate=c.sample_rate,
            channels=c.channels,
            start_s=start,
            clip_seconds=shape.clip_seconds,
        )
        return {
            "key": name,
            "video": torch.from_numpy(video),
            "audio": torch.from_numpy(audio),
            "bucket": shape.bucket,
        }


class StreamBench:
    """One stream: its loader, its webdataset baseline, and the bookkeeping that makes
    both decode the same clips. Subclasses say how to build each."""

    name = ""

    def __init__(
        self,
        items: dict[str, Item],
        clip: Clip,
        *,
        seed: int,
        epochs: int,
        start_method: str,
        max_batches: int,
    ) -> None:
        self.items = items
        self.clip = clip
        self.seed = seed
        self.epochs = epochs
        self.start_method = start_method
        self.max_batches = max_batches
        self.shapes = {name: item.shape for name, item in items.items()}
        self.starts: dict[str, list[float]] = {}  # name -> the loader's clip starts, in order
        self.reference: dict[str, tuple[Any, Any]] = {}  # name -> (video, audio) from stoker
        self.check = {"compared": 0, "mismatched": 0, "bucket_mismatched": 0}

    # What a stream defines.

    def loader(self, workers: int) -> StreamingLoader:
        raise NotImplementedError

    def webdataset(self, workers: int, repeat: int) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def sample_name(self, batch: dict[str, Any], row: int) -> str:
        return str(batch["key"][row])

    def bucket_names(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        """data, loader, baseline: for the result file."""
        raise NotImplementedError

    # Shared.

    def loader_options(self, workers: int) -> dict[str, Any]:
        c = self.clip
        return {
            "num_workers": workers,
            "seed": self.seed,
            "modalities": ("video", "audio"),
            "fps": c.fps,
            "size": c.size,
            "clip_seconds": c.clip_seconds,
            "sample_rate": c.sample_rate,
            "channels": c.channels,
            "clip_offset": "random",
            "resize": c.resize,
            "shuffle": True,
            "start_method": self.start_method,
        }

    def data_loader(self, dataset: Any, workers: int) -> Iterator[dict[str, Any]]:
        """A torch DataLoader as StreamingLoader's: same workers, start method, prefetch."""
        import multiprocessing

        from torch.utils.data import DataLoader

        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=multiprocessing.get_context(self.start_method)
            if workers
            else None,
            prefetch_factor=2 if workers else None,
        )
        yield from loader

    def shuffled_decoded(self, source: DataSource, repeat: int, prefix: str = "") -> Any:
        """The baseline's samples of `source`: webdataset over its tars, shards shuffled,
        a shuffle buffer of raw bytes (decoding after shuffling, as is usual), the same
        decode as the loader's."""
        import webdataset as wds

        urls = shard_urls(source)
        return (
            wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                nodesplitter=wds.single_node_only,
                workersplitter=wds.split_by_worker,
                seed=self.seed + repeat,
                empty_check=False,
            )
            .shuffle(SHUFFLE_BUFFER)
            .map(self.decode_for(prefix))
        )

    def decode_for(self, prefix: str = "") -> WebDatasetDecode:
        return WebDatasetDecode(self.clip, self.shapes, self.starts, prefix)

    def run_ours(self, workers: int, repeat: int) -> Run:
        loader = self.loader(workers)
        at_first: dict[str, float] = {}
        first_run = not self.starts  # every run streams the same clips: record them once

        def on_batch(n: int, batch: dict[str, Any]) -> None:
            if n == 0:
                at_first.update(loader.stats().as_dict())
            if first_run:
                self._record(n, batch)

        batches = loader.batches(max_batches=self.max_batches)
        run = drive("stoker", workers, repeat, batches, on_batch)
        stats = loader.stats().as_dict()
        run.video_frames = int(stats["video_frames"] - at_first["video_frames"])
        run.decode_s = round(stats["decode_s"] - at_first["decode_s"], 3)
        run.bytes_read = int(stats["bytes_read"])
        return run

    def _record(self, n: int, batch: dict[str, Any]) -> None:
        """The clip start of each sample of the loader's batch (stoker/data/stream/worker.py
        draws it from the sample's position), and a few clips to compare."""
        from stoker.data.media.decode import clip_start

        names = self.bucket_names()
        compared = 0
        for row, position in enumerate(batch["position"].tolist()):
            name = self.sample_name(batch, row)
            item = self.items[name]
            u = float(np.random.default_rng([self.seed % 2**64, position, 1]).random())
            starts = self.starts.setdefault(name, [])
            starts.append(clip_start(item.entry.duration_s, item.shape.clip_seconds, u))
            if names and batch["bucket"] != names[item.shape.bucket]:
                self.check["bucket_mismatched"] += 1
            first = len(starts) == 1  # webdataset compares a sample the first time it meets it
            if (
                n >= 1
                and first
                and compared < COMPARED_PER_BATCH
                and len(self.reference) < COMPARED_SAMPLES
            ):
                self.reference[name] = (batch["video"][row], batch["audio"][row])
                compared += 1

    def run_theirs(self, workers: int, repeat: int) -> Run:
        import torch

        frames = 0
        read = 0.0
        compared: set[str] = set()

        def on_batch(n: int, batch: dict[str, Any]) -> None:
            nonlocal frames, read
            if n > 0:
                frames += int(batch["video"].shape[0] * batch["video"].shape[1])
            read += sum(self.items[name].bytes_per_sample for name in batch["key"])
            for row, name in enumerate(batch["key"]):
                if name in self.reference and name not in compared:  # its first epoch
                    compared.add(name)
                    video, audio = self.reference[name]
                    self.check["compared"] += 1
                    equal = torch.equal(video, batch["video"][row]) and torch.equal(
                        audio, batch["audio"][row]
                    )
                    self.check["mismatched"] += not equal

        run = drive("webdataset", workers, repeat, self.webdataset(workers, repeat), on_batch)
        run.video_frames = frames
        run.bytes_read = round(read)  # every shard, start to end
        return run

    def same_output(self) -> dict[str, Any]:
        c = self.check
        ok = c["compared"] > 0 and c["mismatched"] == 0 and c["bucket_mismatched"] == 0
        return {**c, "ok": ok}

    def spans(self, count: int) -> list[Span]:
        """Clip spans for the decode measurement: `count` samples spread over the
        stream's (sorted by name: over its data sets and buckets), each at the first
        start the loader drew for it, moved onto the source frame grid."""
        names = sorted(self.starts)
        picked = names[:: max(1, len(names) // max(1, count))][:count]
        out = []
        for name in picked:
            item = self.items[name]
            video = item.entry.video
            assert video is not None
            member = item.entry.members[video.field]
            data = item.source.fs.cat_file(
                item.source.shard_path(item.shard),
                start=member.offset,
                end=member.offset + member.size,
            )
            grid = video.fps
            out.append(
                Span(
                    data=data,
                    start_s=round(self.starts[name][0] * grid) / grid,
                    clip_seconds=item.shape.clip_seconds,
                    source_fps=video.fps,
                    out_fps=self.clip.fps,
                    out_size=item.shape.size,
                    resize=self.clip.resize,
                )
            )
        return out

    def clip_info(self) -> dict[str, Any]:
        return {
            **asdict(self.clip),
            "epochs_per_run": self.epochs,
            "batches_per_run": self.max_batches,
            "clip_offset": "random",
            "shuffle": True,
            "start_method": self.start_method,
        }


def source_info(source: DataSource) -> dict[str, Any]:
    """What a data set holds (its first sample's media), for the result file."""
    first = source.read_index(0).samples[0]
    assert first.video is not None and first.audio is not None
    return {
        "samples": source.manifest.samples,
        "shards": len(source.manifest.shards),
        "bytes": source.manifest.totals.bytes,
        "codec": first.video.codec,
        "size": [first.video.height, first.video.width],
        "fps": first.video.fps,
        "keyframe_interval": first.video.keyframe_interval,
        "seconds": first.duration_s,
        "audio": f"{first.audio.codec} {first.audio.sample_rate} Hz x{first.audio.channels}",
    }


def items_of(source: DataSource, shape_of: Any, prefix: str = "") -> dict[str, Item]:
    """Every sample of `source` by its name in the stream; `shape_of(entry)` -> Shape."""
    return {
        prefix + entry.key: Item(source, shard, entry, shape_of(entry))
        for shard in range(len(source.manifest.shards))
        for entry in source.read_index(shard).samples
    }


def wds_version() -> str:
    from importlib.metadata import version

    return version("webdataset")


def shard_urls(source: DataSource) -> list[str]:
    return [source.shard_path(i) for i in range(len(source.manifest.shards))]
