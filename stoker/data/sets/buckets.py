"""Buckets: clips of one size and length, batched together (data.buckets).

Each sample goes to one bucket, chosen from what its shard index says (display size,
duration), never from its bytes; so every rank and worker that reads the same index
puts it in the same bucket. The rule, in order:

1. the buckets whose clips fit in the sample (clip_seconds <= its duration); when none
   fits, the buckets with the shortest clips (the clip is then padded, as today);
2. with video, the nearest aspect ratio (|log(w/h) - log(W/H)|): a clip keeps its shape
   and loses the least to the centre crop;
3. the longest clip;
4. with video, the largest frame that does not enlarge the source, else the smallest;
5. the bucket listed first.

A bucket's global batch size is its own `batch_size`, or the token budget
(data.batch_tokens) over its tokens per clip, rounded down to data.batch_multiple.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.data.format.shard_format import SampleEntry
from stoker.errors import StokerError


@dataclass(frozen=True)
class Bucket:
    """One bucket as the loader uses it."""

    resolution: tuple[int, int]
    """(height, width) of its frames."""
    clip_seconds: float
    batch_size: int
    """Global: samples per batch of this bucket across all ranks."""

    @property
    def name(self) -> str:
        """'64x96x2s': what metrics, lineage and messages call it."""
        height, width = self.resolution
        return f"{height}x{width}x{self.clip_seconds:g}s"


def bucket_tokens(
    resolution: tuple[int, int],
    clip_seconds: float,
    *,
    video: bool,
    fps: float,
    token_patch: tuple[int, int, int],
    audio_tokens_per_s: float,
) -> int:
    """Tokens of one clip: video patches of token_patch (frames, height, width), or
    audio_tokens_per_s for audio-only clips."""
    if video:
        frames = max(1, round(clip_seconds * fps))
        pt, ph, pw = token_patch
        return (
            math.ceil(frames / pt) * math.ceil(resolution[0] / ph) * math.ceil(resolution[1] / pw)
        )
    return max(1, math.ceil(clip_seconds * audio_tokens_per_s))


def resolve_buckets(data: Any, *, key: str = "data.buckets") -> list[Bucket]:
    """The buckets `data` (the experiment's DataConfig) asks for, with their batch sizes;
    [] without data.buckets. A StokerError names a bucket the budget cannot fill."""
    video = "video" in data.modalities
    buckets = []
    for i, spec in enumerate(data.buckets):
        resolution: tuple[int, int] = tuple(spec.resolution or data.resolution)
        size = spec.batch_size
        if size is None:
            tokens = bucket_tokens(
                resolution,
                spec.clip_seconds,
                video=video,
                fps=data.fps,
                token_patch=tuple(data.token_patch),
                audio_tokens_per_s=data.audio_tokens_per_s,
            )
            size = data.batch_tokens // tokens // data.batch_multiple * data.batch_multiple
            if size < 1:
                raise StokerError(
                    f"{key}[{i}] ({resolution[0]}x{resolution[1]}, {spec.clip_seconds:g} s): "
                    f"one clip is {tokens} tokens, so data.batch_tokens={data.batch_tokens} "
                    f"holds fewer than data.batch_multiple={data.batch_multiple} of them",
                    fix=f"raise data.batch_tokens to at least {tokens * data.batch_multiple}, "
                    f"or give this bucket a batch_size",
                )
        buckets.append(Bucket(resolution, float(spec.clip_seconds), int(size)))
    return buckets


def assign_bucket(entry: SampleEntry, buckets: Sequence[Bucket], *, video: bool) -> int:
    """The bucket of a sample (the rule in the module's docstring); a latent sample's is
    the bucket it was encoded at, by name (its latents have that bucket's shape)."""
    if entry.latent is not None:
        return _encoded_bucket(entry, buckets)
    duration = entry.duration_s
    fits = [i for i, b in enumerate(buckets) if b.clip_seconds <= duration + 1e-6]
    if not fits:
        shortest = min(b.clip_seconds for b in buckets)
        fits = [i for i, b in enumerate(buckets) if b.clip_seconds == shortest]
    info = entry.video if video else None
    if info is None or info.width < 1 or info.height < 1:
        return min(fits, key=lambda i: (-buckets[i].clip_seconds, i))
    aspect = math.log(info.width / info.height)
    area = info.width * info.height

    def rank(i: int) -> tuple[float, float, bool, int, int]:
        b = buckets[i]
        height, width = b.resolution
        enlarges = height * width > area
        return (
            round(abs(math.log(width / height) - aspect), 9),
            -b.clip_seconds,
            enlarges,
            height * width if enlarges else -height * width,
            i,
        )

    return min(fits, key=rank)


def _encoded_bucket(entry: SampleEntry, buckets: Sequence[Bucket]) -> int:
    assert entry.latent is not None
    name = entry.latent.bucket
    for i, bucket in enumerate(buckets):
        if bucket.name == name:
            return i
    raise StokerError(
        f"latent sample {entry.key!r} was encoded at bucket {name or '(no buckets)'}, which "
        f"data.buckets ({', '.join(b.name for b in buckets)}) does not list",
        fix="list the buckets the data set was encoded with (`stoker data inspect` shows "
        "them), or leave data.buckets empty to take them as they are",
    )


def bucket_ids(
    entries: Iterable[SampleEntry], buckets: Sequence[Bucket], *, video: bool
) -> list[int]:
    return [assign_bucket(e, buckets, video=video) for e in entries]


def bucket_counts(
    entries: Iterable[SampleEntry], buckets: Sequence[Bucket], *, video: bool
) -> dict[str, int]:
    """Samples per bucket name, every bucket listed (0 where none falls)."""
    counts = Counter(bucket_ids(entries, buckets, video=video))
    return {b.name: counts.get(i, 0) for i, b in enumerate(buckets)}


def suggest_buckets(
    entries: Sequence[SampleEntry],
    *,
    max_side: int = 256,
    multiple: int = 16,
    lengths: int = 3,
    shapes: int = 3,
) -> list[dict[str, Any]]:
    """Buckets for data.buckets from the samples' statistics: the `shapes` most common
    aspect ratios (video), each scaled so its longer side is at most `max_side` and at
    most the smallest of that ratio's videos (a bucket never upscales its samples), and
    both sides are multiples of `multiple`, times `lengths` clip lengths at the quantiles of
    the durations (each a length most samples hold whole). Each with the share of the
    samples it would get, for the person choosing batch sizes."""
    if not entries:
        return []
    durations = sorted(e.duration_s for e in entries if e.duration_s > 0) or [1.0]
    quantiles = [durations[int(q * (len(durations) - 1))] for q in _quantiles(lengths)]
    seconds = sorted({_round_seconds(s) for s in quantiles if s > 0}) or [1.0]
    videos = [e.video for e in entries if e.video is not None and e.video.height > 0]
    resolutions: list[tuple[int, int] | None] = [None]
    if videos:
        ratios = Counter(_simple_ratio(v.width, v.height) for v in videos)
        smallest: dict[tuple[int, int], int] = {}
        for v in videos:
            ratio, longer = _simple_ratio(v.width, v.height), max(v.width, v.height)
            smallest[ratio] = min(smallest.get(ratio, longer), longer)
        resolutions = [
            _fit(w, h, min(max_side, smallest[(w, h)]), multiple)
            for (w, h), _ in ratios.most_common(shapes)
        ]
        resolutions = list(dict.fromkeys(resolutions))
    candidates = [
        Bucket(resolution or (max_side, max_side), s, 1)
        for resolution in resolutions
        for s in seconds
    ]
    counts = bucket_counts(entries, candidates, video=bool(videos))
    out = []
    for bucket, resolution in zip(
        candidates, [r for r in resolutions for _ in seconds], strict=True
    ):
        share = counts[bucket.name] / len(entries)
        row: dict[str, Any] = {"clip_seconds": bucket.clip_seconds, "share": round(share, 4)}
        if resolution is not None:
            row = {"resolution": list(resolution), **row}
        out.append(row)
    return [row for row in out if row["share"] > 0]


def _quantiles(n: int) -> list[float]:
    # The lengths most samples hold whole: low quantiles of the durations.
    return [0.1 + 0.8 * i / max(1, n - 1) for i in range(n)] if n > 1 else [0.1]


def _round_seconds(seconds: float) -> float:
    """Down to a readable length: 0.5 s steps above 1 s, 0.1 s below."""
    step = 0.5 if seconds >= 1 else 0.1
    return round(max(step, math.floor(seconds / step) * step), 3)


def _simple_ratio(width: int, height: int) -> tuple[int, int]:
    g = math.gcd(width, height)
    return width // g, height // g


def _fit(width: int, height: int, max_side: int, multiple: int) -> tuple[int, int]:
    """(height, width) with the aspect width:height, longer side <= max_side, both
    multiples of `multiple` (at least one multiple, or the side itself when smaller)."""
    scale = max_side / max(width, height)

    def side(length: float) -> int:
        pixels = max(1, int(length * scale))
        return max(min(multiple, pixels), pixels // multiple * multiple)

    return side(height), side(width)


def encoded_buckets(urls: Sequence[str], batch_size: int) -> list[Bucket]:
    """The buckets latent data sets were encoded with (their manifests say), each with
    the global `batch_size`: what a loader of latents batches by when data.buckets is
    empty. [] for data sets encoded at one shape; a StokerError when data sets of one
    mixture were encoded with different buckets."""
    from stoker.data.sets.dataset import open_dataset

    found: dict[str, list[tuple[str, tuple[int, int], float]]] = {}
    for url in urls:
        encoding = open_dataset(url).manifest.encoding
        if encoding is None:
            raise StokerError(
                f"data set {url!r} holds no latents (its manifest has no encoding record), "
                "but data.modalities asks for latent",
                fix="point at a data set `stoker data encode` wrote, or drop latent from "
                "data.modalities",
            )
        found[url] = [(b.name, b.resolution, b.clip_seconds) for b in encoding.decode.buckets]
    lists = list(found.values())
    if any(other != lists[0] for other in lists[1:]):
        shown = "; ".join(f"{u}: {[b[0] for b in bs] or 'one shape'}" for u, bs in found.items())
        raise StokerError(
            f"the latent data sets were encoded with different buckets ({shown})",
            fix="list the buckets to train on in data.buckets (each data set's must be among them)",
        )
    return [Bucket(resolution, seconds, batch_size) for _, resolution, seconds in lists[0]]
