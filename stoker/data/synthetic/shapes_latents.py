"""The latent data set behind `data.url: null` with `data.modalities: [latent]`: the
clips of stoker/data/synthetic/shapes.py (bouncing shapes with tones that follow them), drawn
as arrays and encoded at once by stoker's tiny encoder (stoker/data/encode/tiny_encoder.py),
never written as media, so neither PyAV nor soundfile is needed to make or read it.

Each sample is one `<key>.latent.safetensors` holding float16 "video"
[T, 8, H/4, W/4] and "audio" [16, N/160] (T frames and N samples of one
data.clip_seconds clip at data.fps and data.sample_rate), what `stoker data encode
--encoder stoker.data.tiny_encoder:build` gives for the same clip decoded, plus
the clip's caption (`.txt`) and metadata (`.json`). Its manifest's encoding record
names that encoder and, as its source, the synth parameters.

The shapes follow from the data settings alone (`synthetic_latent_shapes`): the
model is built for them before the set exists, and the writer checks that the
encoder gave exactly those. stoker/data/synthetic/default_set.py makes the set on first use
under $STOKER_HOME/data/ with the same lock-and-rename as the media set.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.data.format.latent_format import (
    LATENT_MEMBER,
    LATENT_VERSION,
    DecodeRecord,
    EncodingRecord,
    LatentEntry,
    SourceRecord,
    TensorInfo,
)
from stoker.data.format.shard_format import (
    CAPTION_EXT,
    MANIFEST_NAME,
    METADATA_EXT,
    SHARDS_DIR,
    Manifest,
    build_manifest,
    dump,
    record_for,
    shard_file_name,
)
from stoker.errors import StokerError

if TYPE_CHECKING:
    from stoker.config import DataConfig

ENCODER = "stoker.data.tiny_encoder:build"
"""The encoder of the synthetic latents (its identity goes into the manifest)."""
CREATED_BY = "stoker synthetic latents"
# The tiny encoder's defaults; its audio input channels follow data.channels.
VIDEO_CHANNELS, FACTOR, AUDIO_CHANNELS, HOP, DTYPE = 8, 4, 16, 160, "float16"
CLIPS_PER_SHARD = 64
"""About 2.3 MB per shard at 64x64, 8 fps, 1 s: a few shards to shuffle across."""
_BATCH = 32  # clips per encoder call


def encoder_args(data: DataConfig) -> dict[str, str]:
    """The tiny encoder's arguments, as `--args` would give them."""
    return {
        "channels": str(VIDEO_CHANNELS),
        "factor": str(FACTOR),
        "audio_channels": str(AUDIO_CHANNELS),
        "hop": str(HOP),
        "audio_in": str(data.channels),
        "dtype": DTYPE,
        "seed": "0",
    }


def clip_lengths(data: DataConfig) -> tuple[int, int]:
    """(frames, audio samples) of one clip, as stoker/data/synthetic/shapes.py draws it."""
    frames = round(data.clip_seconds * data.fps)
    return frames, round(frames * data.sample_rate / data.fps)


def synthetic_latent_shapes(data: DataConfig) -> dict[str, TensorInfo]:
    """Each tensor's shape and dtype in the synthetic latent set for these data
    settings; a StokerError naming the setting when the tiny encoder cannot take it."""
    if data.buckets:
        raise StokerError(
            "data.buckets is set, but the synthetic latent set (data.url null, "
            "data.modalities [latent]) holds clips of one shape",
            fix="leave data.buckets empty, or set data.url to a latent data set "
            "`stoker data encode` wrote with buckets",
        )
    height, width = data.resolution
    if height % FACTOR or width % FACTOR:
        raise StokerError(
            f"data.resolution {[height, width]} is not a multiple of {FACTOR}, the tiny "
            "encoder's patch, which makes the synthetic latents",
            fix=f"use a multiple of {2 * FACTOR} (the av_dit also wants the latent side "
            "even), e.g. data.resolution=[64,64]",
        )
    frames, samples = clip_lengths(data)
    if frames < 1 or samples < HOP:
        raise StokerError(
            f"data.clip_seconds {data.clip_seconds:g} is shorter than one video frame at "
            f"data.fps {data.fps} or one audio latent ({HOP} samples at data.sample_rate "
            f"{data.sample_rate})",
            fix="use a longer clip, e.g. data.clip_seconds=1.0",
        )
    return {
        "video": TensorInfo(
            shape=(frames, VIDEO_CHANNELS, height // FACTOR, width // FACTOR), dtype=DTYPE
        ),
        "audio": TensorInfo(shape=(AUDIO_CHANNELS, samples // HOP), dtype=DTYPE),
    }


def synthetic_decode(data: DataConfig) -> DecodeRecord:
    """The decode settings the synthetic latents stand for (the encoding record's)."""
    return DecodeRecord(
        modalities=["video", "audio"],
        fps=float(data.fps),
        resolution=(data.resolution[0], data.resolution[1]),
        clip_seconds=data.clip_seconds,
        sample_rate=data.sample_rate,
        channels=data.channels,
        resize=data.resize,
    )


def write_synthetic_latents(path: Path, data: DataConfig, *, clips: int, seed: int) -> Manifest:
    """Write `clips` synthetic clips (those of `synth_dataset(seed=seed)`), encoded,
    as a latent data set in the folder `path` (made; meant to be a fresh one)."""
    from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped, unused-ignore]

    from stoker.data.encode.encoder_api import encoder_identity
    from stoker.data.encode.tiny_encoder import build
    from stoker.data.write.shard_writer import write_json_atomic, write_shard

    shapes = synthetic_latent_shapes(data)
    args = encoder_args(data)
    encoder = build(**{k: v if k == "dtype" else int(v) for k, v in args.items()})
    fs = LocalFileSystem()
    (path / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    samples = _samples(encoder, data, shapes, clips, seed)
    records, indexes = [], []
    for number in range(-(-clips // CLIPS_PER_SHARD)):
        count = min(CLIPS_PER_SHARD, clips - number * CLIPS_PER_SHARD)
        relative = f"{SHARDS_DIR}/{shard_file_name(number)}"
        shard = [next(samples) for _ in range(count)]
        index = write_shard(fs, str(path / relative), shard, version=LATENT_VERSION)
        records.append(record_for(index, relative))
        indexes.append(index)
    source = _source(data, clips, seed)
    encoding = EncodingRecord(
        encoder=encoder_identity(ENCODER, args, build),
        source=source,
        decode=synthetic_decode(data),
        shapes={"": shapes},
    )
    manifest = build_manifest(records, indexes, created_by=CREATED_BY, encoding=encoding)
    write_json_atomic(fs, str(path / MANIFEST_NAME), dump(manifest))
    return manifest


def _source(data: DataConfig, clips: int, seed: int) -> SourceRecord:
    """The synth parameters as the latents' source: no manifest, so its digest is
    the SHA-256 of the parameters' JSON."""
    height, width = data.resolution
    params = {
        "seed": seed,
        "clips": clips,
        "seconds": data.clip_seconds,
        "size": [height, width],
        "fps": data.fps,
        "sample_rate": data.sample_rate,
    }
    text = json.dumps(params, sort_keys=True)
    return SourceRecord(
        url=f"synth:seed={seed},clips={clips},{height}x{width},{data.fps}fps,"
        f"{data.sample_rate}hz,{data.clip_seconds:g}s",
        manifest_sha256=hashlib.sha256(text.encode()).hexdigest(),
        samples=clips,
        created_by="stoker.data.synth arrays",
    )


def _samples(
    encoder: Any, data: DataConfig, shapes: dict[str, TensorInfo], clips: int, seed: int
) -> Iterator[Any]:
    """Clips 0..clips-1 as `SampleToWrite`, encoded `_BATCH` at a time."""
    import numpy as np
    import torch
    from safetensors.torch import save

    from stoker.data.synthetic.shapes import clip_arrays
    from stoker.data.write.shard_writer import SampleToWrite

    height, width = data.resolution
    draw = partial(
        clip_arrays,
        seconds=data.clip_seconds,
        size=(height, width),
        fps=data.fps,
        sample_rate=data.sample_rate,
        seed=seed,
    )
    for start in range(0, clips, _BATCH):
        arrays = [draw(i) for i in range(start, min(clips, start + _BATCH))]
        video = torch.from_numpy(np.stack([a.video for a in arrays])).permute(0, 1, 4, 2, 3)
        audio = torch.from_numpy(np.stack([_channels(a.audio, data.channels) for a in arrays]))
        out = encoder({"video": video, "audio": audio.float()})
        for row, clip in enumerate(arrays):
            tensors = {name: out[name][row].contiguous() for name in ("video", "audio")}
            got = {n: TensorInfo(shape=tuple(t.shape), dtype=DTYPE) for n, t in tensors.items()}
            if got != shapes:  # the formula above and the encoder disagree: a bug here
                raise StokerError(
                    f"the synthetic latents came out as {got}, not {shapes} as "
                    "synthetic_latent_shapes says",
                    fix="report this as a bug in stoker/data/synthetic/shapes_latents.py",
                )
            yield SampleToWrite(
                key=f"clip-{clip.metadata['clip']:06d}",
                members={
                    LATENT_MEMBER: save(tensors),
                    METADATA_EXT: json.dumps(clip.metadata, sort_keys=True).encode(),
                    CAPTION_EXT: clip.caption.encode(),
                },
                latent=LatentEntry(clip_seconds=data.clip_seconds, tensors=got),
            )


def _channels(stereo: Any, channels: int) -> Any:
    """[N, 2] stereo to [channels, N] float32, as decode_audio mixes: the mean for
    mono, both for stereo, each channel j the source channel j % 2 beyond."""
    import numpy as np

    if channels == 1:
        return stereo.mean(axis=1, keepdims=True).T.astype(np.float32)
    return np.stack([stereo[:, j % 2] for j in range(channels)]).astype(np.float32)
