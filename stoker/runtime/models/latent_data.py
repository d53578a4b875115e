"""The shapes of a run on latents (`data.modalities: [latent]`): read from the latent
data sets' manifests, which record each bucket's tensor shapes
(stoker/data/format/latent_format.py), so a model is built for the latents before any is read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stoker.data.sets.buckets import Bucket, encoded_buckets, resolve_buckets
from stoker.data.sets.dataset import open_dataset
from stoker.errors import StokerError
from stoker.model import ClipShape, DataShapes, LatentShape

if TYPE_CHECKING:
    from stoker.config import DataConfig


def latent_data_shapes(data: DataConfig) -> DataShapes:
    """DataShapes of latent data sets: the encode's decode settings in the clip fields,
    one LatentShape per bucket trained on (data.buckets, else the encoded ones). With
    data.url null, those of the synthetic latent set (stoker/data/synthetic/shapes_latents.py)."""
    buckets: list[Bucket]
    if not data.sources and data.url is None:
        # The synthetic latent set: its shapes follow from the settings (it may not
        # exist yet: the model is checked before it is written).
        from stoker.data.synthetic.shapes_latents import synthetic_decode, synthetic_latent_shapes

        urls = ["the synthetic latent set"]
        found = [{"": synthetic_latent_shapes(data)}]
        decode = synthetic_decode(data)
        buckets = []
    else:
        urls = [s.url for s in data.sources] if data.sources else [str(data.url)]
        encodings = []
        for url in urls:
            encoding = open_dataset(url).manifest.encoding
            if encoding is None:
                raise StokerError(
                    f"data set {url!r} holds no latents, but data.modalities asks for latent",
                    fix="point at a data set `stoker data encode` wrote, or drop latent",
                )
            encodings.append(encoding)
        found = [e.shapes for e in encodings]
        decode = encodings[0].decode
        buckets = resolve_buckets(data) or encoded_buckets(urls, data.batch_size)
    names: list[str | None] = [b.name for b in buckets] or [None]
    latents = []
    for name in names:
        shapes = [_shape_of(f, name, url) for f, url in zip(found, urls, strict=True)]
        if any(other != shapes[0] for other in shapes[1:]):
            raise StokerError(
                f"the latent data sets {urls} hold latents of different shapes in bucket "
                f"{name or '(one shape)'}: a batch takes one shape",
                fix="mix only latent data sets of one encoder and decode settings",
            )
        tensors, dtypes = shapes[0]
        seconds = next((b.clip_seconds for b in buckets if b.name == name), decode.clip_seconds)
        latents.append(LatentShape(name, seconds, tensors, dtypes))
    clips = tuple(
        ClipShape(
            clip_seconds=b.clip_seconds,
            frames=round(b.clip_seconds * decode.fps),
            resolution=b.resolution,
            channels=decode.channels,
            samples=round(b.clip_seconds * decode.sample_rate),
        )
        for b in buckets
    )
    longest = max([c.clip_seconds for c in clips] or [decode.clip_seconds])
    return DataShapes(
        modalities=tuple(data.modalities),
        clip_seconds=longest,
        fps=round(decode.fps),
        frames=round(longest * decode.fps),
        resolution=(
            max([c.resolution[0] for c in clips] or [decode.resolution[0]]),
            max([c.resolution[1] for c in clips] or [decode.resolution[1]]),
        ),
        sample_rate=decode.sample_rate,
        channels=decode.channels,
        samples=round(longest * decode.sample_rate),
        buckets=clips,
        latents=tuple(latents),
    )


def _shape_of(
    shapes: dict[str, Any], name: str | None, url: str
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    found = shapes.get(name or "")
    if found is None:
        raise StokerError(
            f"latent data set {url!r} has no samples encoded at bucket "
            f"{name or '(one shape)'} (it has {', '.join(k or '(one shape)' for k in shapes)})",
            fix="list only the buckets it was encoded with in data.buckets, or leave "
            "data.buckets empty to take them all",
        )
    return (
        {t: tuple(info.shape) for t, info in found.items()},
        {t: info.dtype for t, info in found.items()},
    )
