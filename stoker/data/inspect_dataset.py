"""What a data set holds: manifest totals and digest, per-shard and per-sample
statistics from the indexes, and a few decoded frames written as PNG for a person to
look at; `read_manifest`, the manifest alone (a run's data lineage)."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    Manifest,
    SampleEntry,
    join,
    parse_manifest,
)
from stoker.data.sets.dataset import open_dataset
from stoker.data.sets.source import DataSource
from stoker.errors import StokerError


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "min": round(ordered[0], 6),
        "median": round(statistics.median(ordered), 6),
        "max": round(ordered[-1], 6),
        "mean": round(statistics.fmean(ordered), 6),
    }


def _counts(values: list[Any]) -> dict[str, int]:
    return {str(k): n for k, n in Counter(values).most_common()}


def inspect_dataset(
    url: str,
    *,
    frames: int = 3,
    frames_dir: Path | None = None,
    storage_options: dict[str, Any] | None = None,
    suggest_buckets: int | None = None,
) -> dict[str, Any]:
    """Statistics of the data set at `url`; with `frames_dir`, the middle frame of
    the first `frames` samples written there as PNG (paths in the result); with
    `suggest_buckets` (the longest frame side), buckets for data.buckets."""
    source = open_dataset(url, storage_options)
    manifest = source.manifest
    entries: list[SampleEntry] = []
    for shard in range(len(manifest.shards)):
        entries += source.read_index(shard).samples
    videos = [e.video for e in entries if e.video is not None]
    audios = [e.audio for e in entries if e.audio is not None]
    report: dict[str, Any] = {
        "url": url,
        "format": f"{manifest.format} v{manifest.version}",
        # The data set's identity, as runs record it (their MLflow dataset inputs).
        "digest": manifest.fingerprint(),
        "created_by": manifest.created_by,
        "shards": len(manifest.shards),
        "samples": manifest.samples,
        "bytes": manifest.totals.bytes,
        "duration_s": manifest.totals.duration_s,
        "modalities": manifest.modalities,
        "fields": manifest.fields,
        "shard_bytes": _spread([float(s.bytes) for s in manifest.shards]),
        "shard_samples": _spread([float(s.samples) for s in manifest.shards]),
        "sample_duration_s": _spread([e.duration_s for e in entries]),
        "video": {
            "samples": len(videos),
            "codecs": _counts([v.codec for v in videos]),
            "sizes": _counts([f"{v.height}x{v.width}" for v in videos]),
            "fps": _counts([round(v.fps, 3) for v in videos]),
            "frames": int(sum(v.frames for v in videos)),
            "keyframe_interval": _spread(
                [float(v.keyframe_interval) for v in videos if v.keyframe_interval]
            ),
        },
        "audio": {
            "samples": len(audios),
            "codecs": _counts([a.codec for a in audios]),
            "sample_rates": _counts([a.sample_rate for a in audios]),
            "channels": _counts([a.channels for a in audios]),
            "seconds": round(sum(a.duration_s for a in audios), 6),
        },
        "frames_written": [],
    }
    if manifest.encoding is not None:
        report["latents"] = _latents(manifest, entries, url)
    if frames_dir is not None and frames > 0:
        report["frames_written"] = _write_frames(source, entries[: frames * 4], frames, frames_dir)
    if suggest_buckets is not None:
        from stoker.data.sets.buckets import suggest_buckets as suggest

        report["suggested_buckets"] = suggest(entries, max_side=suggest_buckets)
    return report


def _latents(manifest: Any, entries: list[SampleEntry], url: str) -> dict[str, Any]:
    """A latent data set's encoder, its lineage (raw -> packed -> encoded), and each
    bucket's samples and tensor shapes."""
    from stoker.data.format.latent_format import chain

    encoding = manifest.encoding
    counts = Counter((e.latent.bucket or "") for e in entries if e.latent is not None)
    return {
        "encoder": encoding.encoder.model_dump(mode="json"),
        "source": {
            "url": encoding.source.url,
            "manifest_sha256": encoding.source.manifest_sha256,
            "samples": encoding.source.samples,
        },
        "lineage": chain(encoding, url),
        "decode": encoding.decode.model_dump(mode="json"),
        "buckets": {
            name or "(one shape)": {
                "samples": counts.get(name, 0),
                "tensors": {t: f"{list(i.shape)} {i.dtype}" for t, i in tensors.items()},
            }
            for name, tensors in encoding.shapes.items()
        },
    }


def read_manifest(url: str, storage_options: dict[str, Any] | None = None) -> Manifest | None:
    """The manifest of the data set at `url`, and nothing else: one read, no shard index
    (open_dataset would index plain WebDataset shards in memory, reading every tar).
    None for plain WebDataset shards (a .tar URL, a brace pattern, a folder of tars),
    which have no manifest. StokerError where there is no data set."""
    from fsspec.core import url_to_fs

    if url.endswith(".tar") or ("{" in url and "}" in url):
        return None
    where = f"{url.rstrip('/')}/{MANIFEST_NAME}"
    fix = "check the URL, credentials (AWS_* variables, storage options) and endpoint"
    try:
        fs, root = url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise StokerError(f"data URL {url!r}: {exc}", fix=fix) from exc
    try:
        raw = fs.cat_file(join(root.rstrip("/"), MANIFEST_NAME))
    except FileNotFoundError:
        try:
            if any(str(p).endswith(".tar") for p in fs.ls(root, detail=False)):
                return None
        except OSError:
            pass
        raise StokerError(
            f"no data set at {url!r}: {MANIFEST_NAME} is missing there",
            fix="point at the root of a data set (`stoker data pack` or `data synth` writes one)",
        ) from None
    except OSError as exc:
        raise StokerError(f"cannot read {where}: {exc}", fix=fix) from exc
    return parse_manifest(raw, where)


def _write_frames(
    source: DataSource, entries: list[SampleEntry], count: int, folder: Path
) -> list[str]:
    from stoker.data.media.decode import decode_video
    from stoker.data.media.errors import MediaError
    from stoker.data.stream.fetch import SampleFetcher
    from stoker.data.stream.loader_stats import LoaderStats

    folder.mkdir(parents=True, exist_ok=True)
    fetcher = SampleFetcher(source, ("video",), LoaderStats())
    written: list[str] = []
    # Entries come from shard 0 onwards; find their shard numbers through the manifest.
    starts = [0]
    for s in source.manifest.shards:
        starts.append(starts[-1] + s.samples)
    for sample_id, entry in enumerate(entries):
        if len(written) == count or entry.video is None:
            continue
        shard = next(i for i in range(len(starts) - 1) if starts[i + 1] > sample_id)
        fetched = fetcher.fetch(sample_id, shard, sample_id - starts[shard])
        try:
            frame = decode_video(
                fetched.members[entry.video.field],
                fps=entry.video.fps,
                size=None,
                start_s=entry.video.duration_s / 2,
                clip_seconds=1 / entry.video.fps,
                info=entry.video,
            )[0]
        except MediaError:
            continue
        path = folder / f"{entry.key.replace('/', '_')}.png"
        path.write_bytes(encode_png(frame.transpose(1, 2, 0)))
        written.append(str(path))
    return written


def encode_png(rgb: Any) -> bytes:
    """PNG bytes of an H x W x 3 uint8 array, through FFmpeg's PNG encoder (no PIL)."""
    import av

    codec = av.CodecContext.create("png", "w")
    codec.width = rgb.shape[1]
    codec.height = rgb.shape[0]
    codec.pix_fmt = "rgb24"
    packets = codec.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24"))
    packets += codec.encode(None)
    return b"".join(bytes(p) for p in packets)
