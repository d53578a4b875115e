"""The clip settings a source data set was made with, as `data pack` recorded them in
its indexes (each sample's video size, frame rate and length): what `data encode`
decodes at unless told otherwise, so 2 s clips packed at 8 fps stay 2 s at 8 fps.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from stoker.data.format.shard_format import SampleEntry
from stoker.data.sets.dataset import open_dataset


@dataclass(frozen=True)
class SourceClips:
    """What the source's samples share (None where it cannot tell)."""

    clip_seconds: float | None
    """The shortest sample's length (a packed set's clips are all one length), to the frame."""
    fps: int | None
    """The most common video frame rate, to a whole frame per second."""
    resolution: tuple[int, int] | None
    """The most common video size, (height, width)."""


def source_clips(url: str) -> SourceClips:
    """The clip settings of the data set at `url`, from its first shard's index (one
    small read): `data pack` writes every shard alike."""
    source = open_dataset(url)
    if not source.manifest.shards:
        return SourceClips(None, None, None)
    return clips_of(source.read_index(0).samples)


def clips_of(samples: list[SampleEntry]) -> SourceClips:
    """The clip settings these samples share; a pure function of their index entries."""
    videos = [s.video for s in samples if s.video is not None]
    fps = Counter(max(1, round(v.fps)) for v in videos).most_common(1)
    sizes = Counter((v.height, v.width) for v in videos).most_common(1)
    durations = [s.duration_s for s in samples if s.duration_s > 0]
    seconds = None
    if durations:
        shortest = min(durations)
        # Whole frames: an mp4 of 2 s at 24 fps may say 1.999 s (mkv and webm round to ms).
        step = 1 / fps[0][0] if fps else 0.001
        seconds = round(round(shortest / step) * step, 6) or None
    return SourceClips(
        clip_seconds=seconds,
        fps=fps[0][0] if fps else None,
        resolution=sizes[0][0] if sizes else None,
    )
