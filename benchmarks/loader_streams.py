"""The streams benchmarks/loader.py times, each a StreamingLoader against the
webdataset pipeline a user would write for the same batches, with the same decode
(benchmarks/loader_stream_bench.py), and the data sets they read.

plain: one data set, one clip shape. Baseline: WebDataset(shardshuffle) .shuffle(64)
    .map(decode) .batched(B).
bucketed: one data set of three shapes and lengths (plain WebDataset tars, which
    StreamingLoader indexes at start), each shape in its own bucket of frame size, clip
    length and batch size. Baseline: WebDataset(shardshuffle) .shuffle(64) .map(decode
    at the sample's bucket shape), then a buffer per bucket that emits a batch when
    full (the usual bucketed batching; leftovers at the end, partial). A sample's
    bucket is assign_bucket on its index entry: the loader's own rule.
mixed: two data sets of different shapes, weights 2:1, one output shape (centre
    crop). Baseline: webdataset.RandomMix of an endless pipeline per data set with the
    same weights, .batched(B).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.loader_stream_bench import (
    SHUFFLE_BUFFER,
    Clip,
    Item,
    Shape,
    StreamBench,
    items_of,
    source_info,
    wds_version,
)

if TYPE_CHECKING:
    from stoker.data.format.shard_format import SampleEntry
    from stoker.data.sets.buckets import Bucket
    from stoker.data.sets.source import DataSource
    from stoker.data.stream.loader import StreamingLoader

STREAMS = ("plain", "bucketed", "mixed")


@dataclass(frozen=True)
class SetSpec:
    """A synthetic data set of the bucketed and mixed streams."""

    name: str
    size: tuple[int, int]
    """(height, width) of the source, and of its bucket."""
    seconds: float
    bucket_clip: float = 1.0
    """Its bucket's clip length, in --clip-seconds."""
    bucket_batch: int = 1
    """Its bucket's batch size, in --batch."""


# Three aspects and lengths, each in its own bucket (the nearest aspect); the tall
# clips' bucket has half the clip length and twice the batch (about the same pixels).
SQUARE = SetSpec("square", (128, 128), 4.0)
SETS = (SQUARE, SetSpec("wide", (96, 160), 3.0), SetSpec("tall", (160, 96), 2.0, 0.5, 2))
MIXTURE = (("square", 2.0), ("wide", 1.0))
"""The mixed stream's data sets and weights."""


class BucketBatches:
    """A webdataset stage: a buffer per bucket, a batch when one is full, what is left
    at the end as partial batches. Module level: workers unpickle it."""

    def __init__(self, batch_sizes: Sequence[int]) -> None:
        self.batch_sizes = tuple(batch_sizes)

    def __call__(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        buffers: list[list[dict[str, Any]]] = [[] for _ in self.batch_sizes]
        for sample in samples:
            bucket = sample["bucket"]
            buffers[bucket].append(sample)
            if len(buffers[bucket]) == self.batch_sizes[bucket]:
                yield _stack(buffers[bucket])
                buffers[bucket] = []
        for rows in buffers:
            if rows:
                yield _stack(rows)


def _stack(rows: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {
        "key": [r["key"] for r in rows],
        "video": torch.stack([r["video"] for r in rows]),
        "audio": torch.stack([r["audio"] for r in rows]),
        "bucket": rows[0]["bucket"],
    }


class PlainStream(StreamBench):
    name = "plain"

    def __init__(
        self,
        source: DataSource,
        clip: Clip,
        batch: int,
        *,
        seed: int,
        epochs: int,
        start_method: str,
    ) -> None:
        super().__init__(
            items_of(source, lambda _: Shape(clip.size, clip.clip_seconds)),
            clip,
            seed=seed,
            epochs=epochs,
            start_method=start_method,
            max_batches=epochs * source.manifest.samples // batch,
        )
        self.source = source
        self.batch = batch

    def loader(self, workers: int) -> StreamingLoader:
        from stoker.data.stream.loader import StreamingLoader

        return StreamingLoader(self.source, batch_size=self.batch, **self.loader_options(workers))

    def webdataset(self, workers: int, repeat: int) -> Iterator[dict[str, Any]]:

        dataset = (
            self.shuffled_decoded(self.source, repeat)
            .batched(self.batch, partial=True)
            .repeat(self.epochs)
        )
        return self.data_loader(dataset, workers)

    def describe(self) -> dict[str, Any]:
        shards = len(self.source.manifest.shards)
        return {
            "data": source_info(self.source),
            "loader": {**self.clip_info(), "batch_size": self.batch},
            "baseline": f"webdataset {wds_version()}: WebDataset(shardshuffle={shards})"
            f".shuffle({SHUFFLE_BUFFER}).map(same decode).batched({self.batch}) in a torch "
            "DataLoader with the same workers and start method",
        }


class BucketedStream(StreamBench):
    name = "bucketed"

    def __init__(
        self,
        source: DataSource,
        clip: Clip,
        buckets: Sequence[Bucket],
        made_of: dict[str, DataSource],
        *,
        seed: int,
        epochs: int,
        start_method: str,
    ) -> None:
        from stoker.data.sets.buckets import assign_bucket

        def shape_of(entry: SampleEntry) -> Shape:
            i = assign_bucket(entry, buckets, video=True)
            return Shape(buckets[i].resolution, buckets[i].clip_seconds, i)

        items = items_of(source, shape_of)
        self.counts = [
            sum(it.shape.bucket == i for it in items.values()) for i in range(len(buckets))
        ]
        super().__init__(
            items,
            clip,
            seed=seed,
            epochs=epochs,
            start_method=start_method,
            # About `epochs` epochs of samples: the loader never sends a partial batch.
            max_batches=sum(
                epochs * n // b.batch_size for n, b in zip(self.counts, buckets, strict=True)
            ),
        )
        self.source = source
        self.buckets = tuple(buckets)
        self.made_of = made_of

    def loader(self, workers: int) -> StreamingLoader:
        from stoker.data.stream.loader import StreamingLoader

        return StreamingLoader(self.source, buckets=self.buckets, **self.loader_options(workers))

    def webdataset(self, workers: int, repeat: int) -> Iterator[dict[str, Any]]:
        import webdataset as wds

        samples = self.shuffled_decoded(self.source, repeat).repeat(self.epochs)
        dataset = wds.DataPipeline(samples, BucketBatches([b.batch_size for b in self.buckets]))
        return self.data_loader(dataset, workers)

    def bucket_names(self) -> list[str]:
        return [b.name for b in self.buckets]

    def describe(self) -> dict[str, Any]:
        shards = len(self.source.manifest.shards)
        sizes = ", ".join(f"{b.name}: {b.batch_size}" for b in self.buckets)
        loader = {k: v for k, v in self.clip_info().items() if k not in ("size", "clip_seconds")}
        return {
            "data": {
                "url": "plain WebDataset tars, indexed by StreamingLoader at start",
                "samples": self.source.manifest.samples,
                "shards": shards,
                "bytes": self.source.manifest.totals.bytes,
                "made_of": {name: source_info(s) for name, s in self.made_of.items()},
            },
            "loader": {
                **loader,
                "buckets": [
                    {**asdict(b), "name": b.name, "samples": n}
                    for b, n in zip(self.buckets, self.counts, strict=True)
                ],
            },
            "baseline": f"webdataset {wds_version()}: WebDataset(shardshuffle={shards})"
            f".shuffle({SHUFFLE_BUFFER}).map(same decode at the sample's bucket shape)"
            f".repeat({self.epochs}), then a buffer per bucket that emits a batch when full "
            f"({sizes}; leftovers at the end, partial), in a torch DataLoader with the same "
            "workers and start method",
        }


class MixedStream(StreamBench):
    name = "mixed"

    def __init__(
        self,
        sources: Sequence[tuple[str, DataSource, float]],
        clip: Clip,
        batch: int,
        *,
        seed: int,
        epochs: int,
        start_method: str,
    ) -> None:
        items: dict[str, Item] = {}
        for name, source, _ in sources:
            shape = Shape(clip.size, clip.clip_seconds)
            items.update(items_of(source, lambda _, s=shape: s, prefix=f"{name}/"))
        super().__init__(
            items,
            clip,
            seed=seed,
            epochs=epochs,
            start_method=start_method,
            max_batches=epochs * len(items) // batch,
        )
        self.sources = tuple(sources)
        self.batch = batch

    def loader(self, workers: int) -> StreamingLoader:
        from stoker.data.stream.loader import MixSource, StreamingLoader

        mixture = [MixSource(name, source, weight) for name, source, weight in self.sources]
        return StreamingLoader(
            mixture, batch_size=self.batch, mixing="random", **self.loader_options(workers)
        )

    def webdataset(self, workers: int, repeat: int) -> Iterator[dict[str, Any]]:
        import webdataset as wds

        pipelines = []
        for name, source, _ in self.sources:
            # Endless: RandomMix ends with the first source that ends.
            pipelines.append(self.shuffled_decoded(source, repeat, f"{name}/").repeat())
        mix = wds.RandomMix(pipelines, probs=[weight for _, _, weight in self.sources])
        per_worker = max(1, self.max_batches // max(1, workers))
        dataset = wds.DataPipeline(mix, wds.batched(self.batch, partial=False)).with_epoch(
            nbatches=per_worker
        )
        return self.data_loader(dataset, workers)

    def sample_name(self, batch: dict[str, Any], row: int) -> str:
        return f"{batch['source'][row]}/{batch['key'][row]}"

    def describe(self) -> dict[str, Any]:
        parts = ", ".join(
            f"WebDataset({name}, shardshuffle={len(s.manifest.shards)})"
            f".shuffle({SHUFFLE_BUFFER}).map(same decode).repeat()"
            for name, s, _ in self.sources
        )
        weights = [w for _, _, w in self.sources]
        return {
            "data": {name: source_info(s) for name, s, _ in self.sources},
            "loader": {
                **self.clip_info(),
                "batch_size": self.batch,
                "mixing": "random",
                "weights": {name: w for name, _, w in self.sources},
            },
            "baseline": f"webdataset {wds_version()}: RandomMix([{parts}], probs={weights})"
            f".batched({self.batch}), {self.max_batches} batches over the workers "
            "(with_epoch), in a torch DataLoader with the same workers and start method",
        }


def write_sets(
    folder: Path,
    specs: Sequence[SetSpec],
    *,
    clips: int,
    fps: int,
    sample_rate: int,
    per_shard: int,
    seed: int,
    workers: int,
) -> dict[str, str]:
    """Synthetic data sets (stoker.data.synthetic.shapes) under `folder`, by name -> URL."""
    from stoker.data.synthetic.shapes import synth_dataset

    urls = {}
    for i, spec in enumerate(specs):
        url = str(folder / spec.name)
        synth_dataset(
            url,
            clips=clips,
            seconds=spec.seconds,
            size=spec.size,
            fps=fps,
            sample_rate=sample_rate,
            samples_per_shard=per_shard,
            seed=seed + 1 + i,
            workers=workers,
        )
        urls[spec.name] = url
    return urls


def merge_as_plain_tars(sets: dict[str, DataSource], folder: Path) -> None:
    """Every shard of `sets` copied into `folder` as a plain WebDataset tar, its keys
    prefixed with its set's name (`wide-clip-000000`): one data set of every shape,
    with unique keys."""
    folder.mkdir(parents=True)
    for name, source in sets.items():
        for shard in range(len(source.manifest.shards)):
            out = folder / f"{name}-{shard:06d}.tar"
            with tarfile.open(source.shard_path(shard)) as src, tarfile.open(out, "w") as dst:
                for member in src:
                    data = src.extractfile(member)
                    if data is None:
                        continue
                    member.name = f"{name}-{member.name}"
                    dst.addfile(member, data)


def set_buckets(sets: Sequence[SetSpec], clip_seconds: float, batch: int) -> list[Bucket]:
    """A bucket per set of the bucketed stream, at the set's own frame size."""
    from stoker.data.sets.buckets import Bucket

    return [Bucket(s.size, clip_seconds * s.bucket_clip, batch * s.bucket_batch) for s in sets]
